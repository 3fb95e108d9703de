"""``gateway.edge.accept``: the serving loop's listener takes new connections in batches,
where libuv (under uvloop) takes one per loop iteration; both measured in loop
iterations on a loop kept busy, as a saturated gateway's is."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from typing import Any

import pytest
import uvloop

from gateway.edge.accept import ACCEPT_BATCH, BatchAcceptLoop, BatchListener, new_loop

CONNECTIONS = 300


class _Counted(asyncio.Protocol):
    made: list[asyncio.BaseTransport]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)


async def _iterations_to_accept(count: int) -> int:
    """Loop iterations (each ~2 ms busy) until ``count`` connections are made."""
    made: list[asyncio.BaseTransport] = []
    protocol = type("P", (_Counted,), {"made": made})
    server = await asyncio.get_running_loop().create_server(protocol, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    clients = []
    for _ in range(count):
        client = socket.socket()
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # connecting in the background
            client.connect(("127.0.0.1", port))
        clients.append(client)
    iterations = 0
    async with asyncio.timeout(30):
        while len(made) < count:
            started = time.perf_counter()
            while time.perf_counter() - started < 0.002:
                pass
            await asyncio.sleep(0)
            iterations += 1
    for transport in made:
        transport.close()
    for client in clients:
        client.close()
    server.close()
    await server.wait_closed()
    return iterations


def test_a_busy_loop_takes_a_burst_of_connections_in_a_few_iterations() -> None:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        iterations = runner.run(_iterations_to_accept(CONNECTIONS))
    assert iterations <= 4 * (CONNECTIONS // ACCEPT_BATCH + 1)


def test_uvloop_alone_takes_one_connection_an_iteration() -> None:
    """The premise: if this fails, libuv accepts in a loop again and the listener can go."""
    with asyncio.Runner(loop_factory=uvloop.Loop) as runner:
        iterations = runner.run(_iterations_to_accept(CONNECTIONS))
    assert iterations >= CONNECTIONS * 0.8


async def _serve_then_close() -> tuple[bytes, bool]:
    loop = asyncio.get_running_loop()

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport  # uvloop's TCPTransport

        def data_received(self, data: bytes) -> None:
            self.transport.write(data.upper())

    server = await loop.create_server(Echo, "127.0.0.1", 0)
    assert isinstance(server, BatchListener) and server.is_serving()
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"ping")
    echoed = await reader.readexactly(4)
    writer.close()
    server.close()
    await server.wait_closed()
    refused = False
    try:
        await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        refused = True
    return echoed, refused and not server.is_serving()


def test_it_serves_and_close_stops_listening() -> None:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        echoed, closed = runner.run(_serve_then_close())
    assert echoed == b"PING"
    assert closed


async def _families(host: str | None) -> set[int]:
    server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, 0)
    families = {sock.family for sock in server.sockets}
    server.close()
    return families


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
def test_a_host_is_bound_on_every_address_it_names(host: str) -> None:
    named = {
        info[0]
        for info in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    }
    with asyncio.Runner(loop_factory=new_loop) as runner:
        assert runner.run(_families(host)) == named


async def _with_options() -> bool:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, reuse_port=True)
    batched = isinstance(server, BatchListener)
    server.close()
    await server.wait_closed()
    return batched


def test_options_it_does_not_take_leave_the_server_to_uvloop() -> None:
    with asyncio.Runner(loop_factory=BatchAcceptLoop) as runner:
        assert runner.run(_with_options()) is False
