"""A client that stops reading mid-stream, on the protocol ``llmso serve`` uses: the gateway
stops reading the upstream at its bound (its memory stays bounded; the rest waits in
the kernel's socket buffers, then in the engine), and after ``server.send_timeout`` the
connection is dropped: the upstream stream is closed (the fake counts an abort) and the
request is counted as ``disconnected``."""

from __future__ import annotations

import asyncio
import re
import socket

from backends.openai_proxy import http1
from bench.client import raw_chat_post
from bench.fake_upstream import FakeOptions
from tests.service.edge_server import Served, gateway_on_edge

_LONG = 60_000  # chunks: more than every buffer between the fake and the client holds
_SMALL = 8192  # the gateway's socket buffer toward the client: a few frames fill it


async def _stalled_client(
    port: int, tokens: int, **extra: object
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream that has begun, then a client that reads nothing more (a small receive
    buffer, so the kernel holds little for it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
    writer.write(raw_chat_post("m", tokens, **extra))
    await reader.readuntil(b"data: {")
    return reader, writer


async def _upstream_connection(served: Served) -> http1._Connection:
    async with served.app.state.registry.lease("m") as lease:
        (stream,) = lease.backend._streams
        conn = stream._response._conn
        assert conn is not None
        return conn


async def _metric(port: int, pattern: str) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


async def test_a_stalled_client_stops_the_upstream_read_at_its_bound() -> None:
    async with gateway_on_edge(FakeOptions(chunks=_LONG), send_buffer=_SMALL) as served:
        _, writer = await _stalled_client(served.port, _LONG)
        conn = await _upstream_connection(served)
        for _ in range(500):
            if conn.paused:
                break
            await asyncio.sleep(0.02)
        assert conn.paused  # the upstream socket is no longer read
        held = conn.buffered
        await asyncio.sleep(0.5)
        assert conn.buffered == held <= http1._HIGH_WATER + 256 * 1024  # one read more
        writer.close()


async def test_a_client_that_reads_nothing_for_send_timeout_is_dropped() -> None:
    # Big frames (logprobs) a millisecond apart: the client's buffers fill at once, and
    # the answer (5 s long) is still running when the gateway gives up on the client.
    options = FakeOptions(chunks=5000, delay_ms=1)
    server = {"send_timeout": 0.5}
    async with gateway_on_edge(options, server, send_buffer=_SMALL) as served:
        reader, writer = await _stalled_client(served.port, 5000, logprobs=True, top_logprobs=5)
        for _ in range(500):
            if served.fake.aborted:
                break
            await asyncio.sleep(0.02)
        assert served.fake.aborted == 1 and served.fake.running == 0
        disconnected = r'llmso_requests_total\{[^}]*status="disconnected"[^}]*\} (\S+)'
        assert await _metric(served.port, disconnected) == 1.0
        try:
            rest = await reader.read()  # what was on its way, then the end
        except ConnectionResetError:
            rest = b""
        assert b"data: [DONE]" not in rest  # cut off, not ended
        writer.close()
