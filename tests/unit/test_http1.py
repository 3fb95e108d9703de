"""``backends.openai_proxy.http1`` against real servers on loopback: an aiohttp app (chunked and
Content-Length answers, keep-alive) and raw asyncio socket servers for the failure
cases (closed mid-body, body until EOF, a stale keep-alive connection, stalls). Every
test runs on both event loops the gateway may use (asyncio's and uvloop's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest
import uvloop
from aiohttp import web

from backends.base import UpstreamBadResponse, UpstreamTimeout, UpstreamUnavailable
from backends.openai_proxy import http1
from backends.openai_proxy.errors import from_exception

_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def on_both_loops(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[str], None]:
    """Run ``test`` once on each loop, each in a loop of its own (the suite's shared
    session loop would hide which one ran)."""

    @pytest.mark.parametrize("loop", sorted(_LOOPS))
    def run(loop: str) -> None:
        with asyncio.Runner(loop_factory=_LOOPS[loop]) as runner:
            runner.run(test())

    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run


class _App:
    """An aiohttp server that records the peer of every request (to see reuse)."""

    def __init__(self) -> None:
        self.peers: list[object] = []
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self._seen(request, await request.read())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(5):
            await response.write(b"data: %d\n\n" % i)
            await asyncio.sleep(0.002)
        await response.write_eof()
        return response

    async def sized(self, request: web.Request) -> web.Response:
        self._seen(request, await request.read())
        return web.Response(status=429, body=b'{"error": "busy"}', headers={"Retry-After": "3"})

    async def stall(self, request: web.Request) -> web.StreamResponse:
        self._seen(request, await request.read())
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first")
        await asyncio.sleep(30)
        return response

    def _seen(self, request: web.Request, body: bytes) -> None:
        transport = request.transport
        self.peers.append(transport.get_extra_info("peername") if transport else None)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))


@contextlib.asynccontextmanager
async def _app() -> AsyncIterator[tuple[_App, str]]:
    state = _App()
    server = web.Application()
    server.router.add_post("/chunked", state.chunked)
    server.router.add_post("/sized", state.sized)
    server.router.add_post("/stall", state.stall)
    runner = web.AppRunner(server, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield state, f"http://127.0.0.1:{port}"
    await runner.cleanup()


@contextlib.asynccontextmanager
async def _raw_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """A socket server that answers with whatever bytes ``handle`` writes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await handle(reader, writer)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return await reader.readexactly(length)


async def _body(response: http1.Response) -> bytes:
    parts = []
    while data := await response.read_some():
        parts.append(data)
    return b"".join(parts)


@on_both_loops
async def test_a_chunked_stream_arrives_whole_and_the_connection_is_reused() -> None:
    async with _app() as (state, root):
        pool = http1.Pool(headers={"Authorization": "Bearer k"})
        try:
            for _ in range(3):
                response = await pool.post(root + "/chunked", b'{"a": 1}', {"traceparent": "00-x"})
                assert response.status == 200
                assert response.header("content-type") == "text/event-stream"
                assert await _body(response) == b"".join(b"data: %d\n\n" % i for i in range(5))
                response.release()
        finally:
            await pool.close()
        assert state.bodies == [b'{"a": 1}'] * 3
        assert state.headers[0]["Authorization"] == "Bearer k"
        assert state.headers[0]["traceparent"] == "00-x"
        assert len(set(state.peers)) == 1  # one keep-alive connection served all three


@on_both_loops
async def test_a_content_length_answer_and_its_headers() -> None:
    async with _app() as (state, root):
        pool = http1.Pool()
        response = await pool.post(root + "/sized", b"{}")
        assert (response.status, response.header("Retry-After")) == (429, "3")
        assert await response.read(64 * 1024) == b'{"error": "busy"}'
        assert response.complete
        response.release()
        again = await pool.post(root + "/sized", b"{}")
        assert await again.read(4) == b'{"er'  # limit honoured
        again.close()  # not read to the end: dropped, not reused
        third = await pool.post(root + "/sized", b"{}")
        third.release()
        await pool.close()
        assert len(set(state.peers[:2])) == 1 and state.peers[2] != state.peers[1]


def _answering(raw: bytes) -> contextlib.AbstractAsyncContextManager[str]:
    """A raw server that reads one request, writes ``raw`` and closes the connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(raw)
        await writer.drain()

    return _raw_server(handle)


@on_both_loops
async def test_a_close_mid_body_is_an_unavailable_upstream() -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
    async with _answering(chunked) as root:
        pool = http1.Pool()
        response = await pool.post(root + "/x", b"{}")
        assert await response.read_some() == b"hello"
        with pytest.raises(http1.RemoteClosed) as caught:
            await response.read_some()
        response.close()
        await pool.close()
    assert isinstance(from_exception(caught.value, url=root), UpstreamUnavailable)


@on_both_loops
async def test_a_body_until_eof_ends_cleanly_and_is_not_reused() -> None:
    async with _answering(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it") as root:
        pool = http1.Pool()
        response = await pool.post(root + "/x", b"{}")
        assert await _body(response) == b"all of it"
        response.release()
        assert not any(pool._idle.values())
        await pool.close()


@on_both_loops
async def test_a_stale_keep_alive_connection_is_replaced_once() -> None:
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        await _read_request(reader)
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # then close the kept-alive connection as a server's idle timeout would

    async with _raw_server(handle) as root:
        pool = http1.Pool()
        first = await pool.post(root + "/x", b"{}")
        assert await _body(first) == b"ok"
        first.release()
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        second = await pool.post(root + "/x", b"{}")
        assert await _body(second) == b"ok"
        second.release()
        await pool.close()
    assert served == 2


@on_both_loops
async def test_read_timeout_and_total_timeout() -> None:
    async with _app() as (_, root):
        pool = http1.Pool(read_timeout=0.1)
        response = await pool.post(root + "/stall", b"{}")
        assert await response.read_some() == b"first"
        with pytest.raises(http1.ReadTimeout) as caught:
            await response.read_some()
        response.close()
        assert isinstance(from_exception(caught.value, url=root), UpstreamTimeout)
        total = http1.Pool(read_timeout=10, total_timeout=0.15)
        response = await total.post(root + "/stall", b"{}")
        await response.read_some()
        with pytest.raises(http1.ReadTimeout):
            await response.read_some()
        response.close()
        await pool.close()
        await total.close()


@on_both_loops
async def test_the_read_timeout_is_per_gap_not_per_answer() -> None:
    """Bytes every 60 ms for 0.5 s under a 0.15 s read timeout: no timeout, though the
    answer takes three timeouts' time (one timer serves every wait, re-armed when it
    finds bytes came meanwhile); then a stall of more than 0.15 s times out."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(8):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.06)
        await asyncio.sleep(5)

    async with _raw_server(handle) as root:
        pool = http1.Pool(read_timeout=0.15)
        response = await pool.post(root + "/x", b"{}")
        loop = asyncio.get_running_loop()
        began = loop.time()
        got = b""
        with pytest.raises(http1.ReadTimeout):
            while True:
                got += await response.read_some()
        waited = loop.time() - began
        response.close()
        await pool.close()
        assert got == b"x" * 8
        assert 0.55 < waited < 1.5


@on_both_loops
async def test_headers_that_never_come_time_out() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(5)

    async with _raw_server(handle) as root:
        pool = http1.Pool(read_timeout=0.1)
        with pytest.raises(http1.ReadTimeout):
            await pool.post(root + "/x", b"{}")
        await pool.close()


@on_both_loops
async def test_cancelling_a_read_leaves_the_response_closable() -> None:
    async with _app() as (_, root):
        pool = http1.Pool()
        response = await pool.post(root + "/stall", b"{}")
        await response.read_some()
        reader = asyncio.ensure_future(response.read_some())
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        response.close()
        with pytest.raises(http1.RemoteClosed):
            await response.read_some()
        await pool.close()


@on_both_loops
async def test_refused_and_invalid_answers_map_to_proxy_errors() -> None:
    pool = http1.Pool(connect_timeout=1.0)
    with pytest.raises(OSError) as refused:
        await pool.post("http://127.0.0.1:1/x", b"{}")
    assert isinstance(from_exception(refused.value, url="u"), UpstreamUnavailable)

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)

    async with _raw_server(garbage) as root:
        with pytest.raises(http1.ProtocolError) as invalid:
            await pool.post(root + "/x", b"{}")
    assert isinstance(from_exception(invalid.value, url=root), UpstreamBadResponse)
    await pool.close()
    with pytest.raises(ValueError):
        await http1.Pool().post("ftp://host/x", b"")


@pytest.mark.parametrize("loop", sorted(_LOOPS))
def test_each_variant_runs_on_its_own_loop(loop: str) -> None:
    async def kind() -> type:
        return type(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=_LOOPS[loop]) as runner:
        assert (runner.run(kind()) is uvloop.Loop) == (loop == "uvloop")
