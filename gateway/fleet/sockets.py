"""The listening sockets of a fleet: one per worker, all on one port (``SO_REUSEPORT``).

Each worker listens on a socket of its own and Linux spreads new connections over the
group by a hash of their addresses. The supervisor holds one more socket on the port,
bound but never listening: it reserves the port (``port: 0`` resolves once, and a port
held by another program fails once, at start) and receives no connection, since only
listening sockets take part in the kernel's choice.
"""

from __future__ import annotations

import socket


class ReusePortUnavailable(OSError):
    """This platform has no ``SO_REUSEPORT`` (workers > 1 needs Linux)."""


def reuseport_socket(host: str, port: int, *, backlog: int | None = None) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT``; listening when
    ``backlog`` is given. Raises ``OSError`` (address in use, no such interface)."""
    reuse = getattr(socket, "SO_REUSEPORT", None)
    if reuse is None:
        raise ReusePortUnavailable("server.workers > 1 needs SO_REUSEPORT (Linux)")
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, reuse, 1)
        sock.bind(address)
        if backlog is not None:
            sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock
