"""``CoalescingHttpToolsProtocol`` under a real uvicorn server: answers stay byte-exact
(plain, streamed, keep-alive), headers of a slow body are not held past the loop turn,
and ``CoalescingTransport`` sends held headers together with the first body bytes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from gateway.edge.transport import CoalescingHttpToolsProtocol, CoalescingTransport


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await receive()
    start = {"type": "http.response.start", "status": 200, "headers": [(b"x-t", b"1")]}
    if scope["path"] == "/plain":
        await send(start)
        await send({"type": "http.response.body", "body": b"hello", "more_body": False})
        return
    await send(start)
    if scope["path"] == "/slow":
        await asyncio.sleep(0.5)  # the client must see the headers before this ends
    for part in (b"a", b"b"):
        await send({"type": "http.response.body", "body": part, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
async def server() -> AsyncIterator[int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, http=CoalescingHttpToolsProtocol, log_config=None, lifespan="off")
    served = uvicorn.Server(config)
    task = asyncio.ensure_future(served.serve(sockets=[sock]))
    while not served.started:  # noqa: ASYNC110 - uvicorn offers no start event
        await asyncio.sleep(0.01)
    yield sock.getsockname()[1]
    served.should_exit = True
    await task


async def _ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[bytes, bytes]:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    return head, await reader.readuntil(b"0\r\n\r\n")


async def test_answers_are_exact_and_keep_alive_works(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    head, body = await _ask(reader, writer, "/plain")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"x-t: 1\r\n" in head
    assert body == b"5\r\nhello\r\n0\r\n\r\n"
    head, body = await _ask(reader, writer, "/stream")  # same connection
    assert b"transfer-encoding: chunked" in head
    assert body == b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n"
    writer.close()
    await writer.wait_closed()


async def test_headers_of_a_slow_body_are_not_held(server: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server)
    writer.write(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
    async with asyncio.timeout(0.4):  # before the body's 0.5 s pause ends
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert await reader.readuntil(b"0\r\n\r\n") == b"1\r\na\r\n1\r\nb\r\n0\r\n\r\n"
    writer.close()
    await writer.wait_closed()


async def test_held_headers_leave_with_the_first_body_bytes() -> None:
    received: list[bytes] = []
    got = asyncio.Event()

    class Sink(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            received.append(data)
            got.set()

    loop = asyncio.get_running_loop()
    listener = await loop.create_server(Sink, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    transport, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    proxy = CoalescingTransport(transport, loop)  # type: ignore[arg-type]
    proxy.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.get_write_buffer_size() == 0 and proxy._held is not None
    proxy.write(b"body")
    assert proxy._held is None
    await got.wait()
    proxy.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    proxy.close()  # flushes what it holds, then closes
    await asyncio.sleep(0.05)
    assert b"".join(received) == b"HTTP/1.1 200 OK\r\n\r\nbodyHTTP/1.1 204 No Content\r\n\r\n"
    listener.close()
    with contextlib.suppress(Exception):
        await listener.wait_closed()
