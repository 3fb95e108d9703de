"""A lean HTTP/1.1 client for the relay's data path: keep-alive connections on asyncio
protocols, answers parsed by httptools. Profiled on 16-chunk streams, aiohttp's request
machinery was ~1/5 of the gateway's CPU per request; the relay only POSTs a serialised
body and takes body bytes as they arrive. Probes, embeddings and scrapes stay on aiohttp.

- ``Pool`` owns the idle connections (per origin, LIFO, at most ``max_idle`` each, none
  older than ``keepalive`` seconds). Open connections are bounded by the caller (the
  backend's ``max_concurrency`` slots), not here. Owned by the event loop that uses it.
- Every wait has a bound: ``connect_timeout`` for the TCP (and TLS) connect,
  ``read_timeout`` for every wait for bytes (headers or body), ``total_timeout`` for the
  whole exchange. Cancelling the awaiting task cancels the wait; the caller then
  ``close()``s the response, which drops the connection.
- Errors are ``OSError`` subclasses the proxy's error mapping already knows:
  ``ConnectTimeout`` and ``RemoteClosed`` are connection errors (upstream unavailable),
  ``ReadTimeout`` is a ``TimeoutError``, ``ProtocolError`` a malformed answer.
- A connection is reused only after its answer was read to the end with keep-alive;
  one that was idle and got closed by the server is dropped when taken, and a request
  whose reused connection dies before any answer byte is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

_HIGH_WATER = 256 * 1024  # buffered answer bytes before reading pauses
_MAX_HEADER_BYTES = 64 * 1024


class ConnectTimeout(ConnectionError):
    """The TCP (or TLS) connect took longer than ``connect_timeout``."""


class RemoteClosed(ConnectionResetError):
    """The server closed the connection before its answer was complete."""


class ReadTimeout(TimeoutError):
    """No bytes for ``read_timeout`` seconds, or the exchange passed ``total_timeout``."""


class ProtocolError(ConnectionError):
    """The server's answer is not valid HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    tls: bool
    head: bytes  # request line and Host header, ready to send

    @property
    def origin(self) -> tuple[str, int, bool]:
        return self.host, self.port, self.tls


class _Connection(asyncio.Protocol):
    """One TCP connection and the answer being read on it; owned by the pool while
    idle, by one ``Response`` while in use."""

    def __init__(self) -> None:
        # Made by ``loop.create_connection``, on the loop it lives on; kept because each
        # ``asyncio.get_running_loop()`` costs a ``getpid`` syscall on Python 3.11.
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.origin: tuple[str, int, bool] = ("", 0, False)
        self._waiter: asyncio.Future[None] | None = None
        # One read-timeout timer, re-armed lazily: a wait moves ``_wait_until`` and
        # only arms a timer when none is due by then. A timer per wait (six per
        # streamed request) cost more than the rest of the wait.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._wait_until = 0.0
        self._wait_seconds = 0.0
        # One parser for the connection's life: llhttp takes the next answer on a
        # keep-alive connection as it is, and a connection whose answer failed to parse
        # (or was not read to the end) is never reused.
        self.parser = httptools.HttpResponseParser(self)
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.headers_done = False
        self.keep_alive = False
        self.until_eof = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.complete = False
        self.got_bytes = False
        self.error: OSError | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = ProtocolError(f"invalid HTTP answer: {exc}")
            self.abort()
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if not self.complete and self.error is None:
            if self.until_eof:  # a body delimited by the end of the connection
                self.complete = True
            else:
                self.error = RemoteClosed(f"server closed the connection: {exc or 'EOF'}")
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > _MAX_HEADER_BYTES:
            raise httptools.HttpParserError("headers too large")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        names = {name for name, _ in self.headers}
        framed = b"content-length" in names or b"transfer-encoding" in names
        self.until_eof = not framed and self.status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True

    # used by Response and Pool
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, seconds: float) -> None:
        """Until the next bytes (or the end) arrive; ``ReadTimeout`` after ``seconds``."""
        if seconds <= 0:
            raise ReadTimeout("the upstream exchange passed its total timeout")
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        self._wait_until = until = loop.time() + seconds
        self._wait_seconds = seconds
        if self._timer is None or self._timer_at > until:
            self._arm(until)
        try:
            await waiter
        finally:
            self._waiter = None

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_timer)
        self._timer_at = when

    def _on_timer(self) -> None:
        """Expire the wait in progress if its time is up, else arm for when it will be."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # the next wait arms a timer of its own
        if self._loop.time() >= self._wait_until:
            waiter.set_exception(ReadTimeout(f"no answer bytes within {self._wait_seconds:g}s"))
        else:
            self._arm(self._wait_until)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def take(self) -> bytes:
        chunks = self.chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.buffered = 0
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    def send(self, data: bytes) -> None:
        self._reset()
        if self.transport is None:
            raise RemoteClosed("the connection is not open")
        self.transport.write(data)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Response:
    """One answer: ``status`` and ``headers`` on return from ``Pool.post``, then the body
    with ``read_some``/``read``. Owned by the task that sent the request; it must call
    ``release()`` (reuse the connection if the answer was read to the end) or
    ``close()`` (drop it)."""

    __slots__ = ("_conn", "_deadline", "_pool", "_read_timeout", "status")

    def __init__(self, pool: Pool, conn: _Connection, deadline: float, read_timeout: float) -> None:
        self._pool = pool
        self._conn: _Connection | None = conn
        self._deadline = deadline
        self._read_timeout = read_timeout
        self.status = conn.status

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), if present."""
        conn = self._conn
        if conn is None:
            return None
        key = name.lower().encode("latin-1")
        for found, value in conn.headers:
            if found == key:
                return value.decode("latin-1")
        return None

    @property
    def complete(self) -> bool:
        """The whole answer has arrived (its body may still be buffered)."""
        return self._conn is not None and self._conn.complete

    async def read_some(self) -> bytes:
        """The body bytes that have arrived (waiting for some if none has); ``b""`` at
        the end of the answer."""
        conn = self._conn
        if conn is None:
            raise RemoteClosed("the response was closed")
        while not conn.chunks:
            if conn.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            await conn.wait(min(self._read_timeout, self._deadline - time.monotonic()))
        return conn.take()

    async def read(self, limit: int) -> bytes:
        """The body up to ``limit`` bytes (less if the answer ends first)."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            data = await self.read_some()
            if not data:
                break
            parts.append(data)
            size += len(data)
        return b"".join(parts)[:limit]

    def release(self) -> None:
        """Give the connection back if its answer is complete and fully read, else drop it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and not conn.chunks and conn.keep_alive and conn.error is None:
            self._pool.put(conn)
        else:
            conn.abort()

    def close(self) -> None:
        """Drop the connection (the server sees the client leave)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.abort()


class Pool:
    """Keep-alive connections to any number of origins. See the module docstring."""

    def __init__(
        self,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        total_timeout: float = 600.0,
        keepalive: float = 30.0,
        max_idle: int = 256,
    ) -> None:
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode(
            "latin-1"
        )
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout
        self._keepalive = keepalive
        self._max_idle = max_idle
        self._idle: dict[tuple[str, int, bool], deque[_Connection]] = {}
        self._targets: dict[str, _Target] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def post(self, url: str, body: bytes, headers: dict[str, str] | None = None) -> Response:
        """Send ``body`` to ``url`` and wait for the status line and headers."""
        if self._closed:
            raise RemoteClosed("the connection pool is closed")
        target = self._target(url)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        request = b"".join(
            (
                target.head,
                self._headers,
                extra.encode("latin-1"),
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        deadline = time.monotonic() + self.total_timeout
        for reused_attempt in (True, False):
            conn = self._get(target) if reused_attempt else None
            reused = conn is not None
            if conn is None:
                conn = await self._connect(target)
            conn.send(request)
            try:
                while not conn.headers_done:
                    if conn.error is not None:
                        raise conn.error
                    await conn.wait(min(self.read_timeout, deadline - time.monotonic()))
            except RemoteClosed:
                conn.abort()
                if reused and not conn.got_bytes:
                    continue  # a stale keep-alive connection: once more on a new one
                raise
            except BaseException:
                conn.abort()
                raise
            return Response(self, conn, deadline, self.read_timeout)
        raise AssertionError("unreachable")

    def put(self, conn: _Connection) -> None:
        if self._closed or conn.closed or conn.transport is None:
            conn.abort()
            return
        idle = self._idle.setdefault(conn.origin, deque())
        if len(idle) >= self._max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    async def close(self) -> None:
        """Drop every idle connection; open responses are their owners' to close."""
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().abort()
        self._idle.clear()

    def _get(self, target: _Target) -> _Connection | None:
        idle = self._idle.get(target.origin)
        if not idle:
            return None
        oldest = time.monotonic() - self._keepalive
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.idle_since >= oldest:
                return conn
            conn.abort()
        return None

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if target.tls else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    _Connection,
                    target.host,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls else None,
                )
        except TimeoutError:
            raise ConnectTimeout(
                f"connect to {target.host}:{target.port} timed out after {self.connect_timeout:g}s"
            ) from None
        conn.origin = target.origin
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _target(self, url: str) -> _Target:
        found = self._targets.get(url)
        if found is not None:
            return found
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.hostname if parts.port is None else f"{parts.hostname}:{port}"
        if ":" in parts.hostname:  # an IPv6 literal goes in brackets
            host_header = f"[{parts.hostname}]" + ("" if parts.port is None else f":{port}")
        head = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")
        target = _Target(parts.hostname, port, tls, head)
        if len(self._targets) < 1024:  # replicas x paths: a handful; bounded anyway
            self._targets[url] = target
        return target
