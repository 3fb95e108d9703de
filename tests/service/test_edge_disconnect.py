"""A client leaving mid-stream, with the gateway on the protocol ``llmso serve`` uses
(``CoalescingHttpToolsProtocol``): the protocol's disconnect hook cancels the request,
the upstream stream is closed (the fake counts an abort), the request is counted as
``disconnected``, and the connection's next request (keep-alive) is unaffected."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from bench.client import raw_chat_post
from bench.fake_upstream import FakeOptions
from tests.service.edge_server import Served, gateway_on_edge


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with gateway_on_edge(FakeOptions(chunks=400, delay_ms=10)) as served:
        yield served


async def _disconnected(port: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()
    found = re.search(r'llmso_requests_total\{[^}]*status="disconnected"[^}]*\} (\S+)', text)
    return float(found.group(1)) if found else 0.0


async def test_leaving_mid_stream_aborts_the_upstream(served: Served) -> None:
    port, fake, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw_chat_post("m", 400))
    await reader.readuntil(b"\r\n\r\n")
    await reader.readuntil(b"data: {")  # the stream is running
    assert fake.running == 1
    writer.close()
    for _ in range(200):
        if fake.aborted:
            break
        await asyncio.sleep(0.02)
    assert fake.aborted == 1 and fake.running == 0
    assert await _disconnected(port) == 1.0


async def test_finished_requests_on_one_connection_are_not_cancelled(
    served: Served,
) -> None:
    port, fake, _ = served
    fake.options = FakeOptions(chunks=4)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(3):  # keep-alive: each request registers and clears the hook
        writer.write(raw_chat_post("m", 4))
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"data: [DONE]\n\n")
    writer.close()
    await asyncio.sleep(0.1)
    assert fake.aborted == 0 and fake.completed == 3
    assert await _disconnected(port) == 0.0
