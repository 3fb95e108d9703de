"""The serving loop: uvloop, with a listener that accepts new connections in batches.

Since libuv 1.45 (libuv#3696, in the uvloop this project pins) a listening socket gets one
``accept`` per event-loop iteration. On an idle gateway that is nothing; on a busy one an
iteration takes as long as all the callbacks ready in it, and new connections wait in the
kernel's queue one iteration each. Measured here (uvloop 0.23, a loop kept busy 10 ms an
iteration): 500 new connections took 5.0 s to be accepted, against 0.05 s on asyncio's
own loop, which takes what is queued at once. At 1,024 GPU-speed streams through one
gateway process (the fleet drill, issue 41) that queue held ~480 connections for ~6 s:
their requests were neither served nor shed, only late.

``BatchAcceptLoop.create_server`` keeps uvloop for everything else but listens itself:
the socket is watched with ``add_reader`` and each wake accepts up to ``ACCEPT_BATCH``
connections, each handed to uvloop as an accepted socket (``connect_accepted_socket``:
the same transport as a uvloop server's). With TLS, or options this listener does not
take, it leaves the server to uvloop. uvicorn runs it as a custom loop
(``Config(loop="gateway.edge.accept:new_loop")``); ``llmso serve`` and the raw relay
(``bench/raw_relay.py``) do.

A ``BatchListener`` is owned by the loop it serves on: its callbacks run there, and
``close`` (uvicorn's shutdown) is called there.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

import uvloop

log = logging.getLogger(__name__)

ACCEPT_BATCH = 128
"""Connections taken per wake of a listening socket: enough that a burst of a thousand
is in within a few iterations, few enough that one wake cannot take a whole iteration."""
_RETRY_S = 1.0
"""After running out of file descriptors, accept again this much later."""
_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def new_loop() -> asyncio.AbstractEventLoop:
    """The loop factory uvicorn calls (``Config(loop=...)``)."""
    return BatchAcceptLoop()


class BatchAcceptLoop(uvloop.Loop):  # type: ignore[misc]
    """uvloop's loop; plain TCP servers accept in batches (see the module docstring)."""

    async def create_server(  # type: ignore[override]
        self,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        host: str | None = None,
        port: int | None = None,
        *,
        sock: socket.socket | None = None,
        backlog: int = 100,
        ssl: Any = None,
        **options: Any,
    ) -> asyncio.AbstractServer:
        if ssl is not None or options or (sock is None and port is None):
            uvloop_server: asyncio.AbstractServer = await super().create_server(
                protocol_factory,
                host,
                port,  # type: ignore[arg-type]  # uvloop's stubs: host and port, or sock
                sock=sock,  # type: ignore[arg-type]
                backlog=backlog,
                ssl=ssl,
                **options,
            )
            return uvloop_server
        sockets = [sock] if sock is not None else _bound(host, port or 0)
        return BatchListener(self, sockets, protocol_factory, backlog)


def _bound(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for every address of ``host`` (all interfaces when None), as
    asyncio binds them: ``SO_REUSEADDR``, IPv6 sockets IPv6 only."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class BatchListener(asyncio.AbstractServer):
    """Listening sockets whose new connections are accepted up to ``ACCEPT_BATCH`` at a
    wake; what uvicorn needs of a server (``sockets``, ``close``, ``wait_closed``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sockets: Iterable[socket.socket],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        backlog: int,
    ) -> None:
        self._loop = loop
        self._sockets = list(sockets)
        self._factory = protocol_factory
        self._serving = True
        self._handing: set[asyncio.Task[None]] = set()
        for sock in self._sockets:
            sock.setblocking(False)
            sock.listen(backlog)
            loop.add_reader(sock.fileno(), self._accept, sock)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_FDS:
                    raise
                # The queue stays in the kernel; try again once descriptors may be free.
                log.error("accepting a connection: %s; retrying in %.0f s", exc, _RETRY_S)
                self._loop.remove_reader(sock.fileno())
                self._loop.call_later(_RETRY_S, self._resume, sock)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._hand_over(conn))
            self._handing.add(task)
            task.add_done_callback(self._handing.discard)

    def _resume(self, sock: socket.socket) -> None:
        if self._serving:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    async def _hand_over(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # gone before its transport was made
            log.debug("an accepted connection failed: %s", exc)
            conn.close()

    def close(self) -> None:
        if not self._serving:
            return
        self._serving = False
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()

    async def wait_closed(self) -> None:
        """Closed once ``close`` returns; uvicorn waits for the connections itself."""

    def is_serving(self) -> bool:
        return self._serving

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    async def start_serving(self) -> None:
        """Serving from the start."""

    async def serve_forever(self) -> None:
        raise NotImplementedError("uvicorn drives this listener; nothing calls serve_forever")
