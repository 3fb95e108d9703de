"""uvicorn's httptools protocol, with a response's headers sent in the same syscall as
its first body bytes.

uvicorn writes the status line and headers the moment the app sends
``http.response.start``, and the body with each ``http.response.body``: two ``write``
syscalls for the smallest response, and on loopback (where a gateway and its engines
often sit) each one also runs the receiver's TCP path. Profiled at 16-chunk streams, the
gateway's writes were the largest single item of its CPU. ``CoalescingTransport`` holds
a write that starts a response (``HTTP/1.1 ...``) until the next write on the
connection, or at the latest until the event loop's next turn, so the headers and the
first frames leave together. Order is always kept (later writes join the held bytes),
so nothing but the syscall count changes; a response whose body is slow to come gets
its headers at the end of the current loop turn.

The protocol also tells a request when its client leaves (``DisconnectHook``, in the
scope under ``DISCONNECT_HOOK``): the gateway's disconnect watcher registers a callback
there instead of running a task per request that waits on ``receive``.

A client that stops reading (``send_timeout``, ``http_protocol``): once its socket and
the transport's buffer (64 KiB) are full, uvicorn's ``send`` waits, so the request's task
stops reading its upstream and the upstream connection's own bound (256 KiB,
``backends.openai_proxy.http1``) stops that read: memory stays bounded, and the engine
feels TCP back-pressure. What bounds the time is this protocol: when writing has been
paused for ``send_timeout`` seconds without a moment of progress, the connection is
dropped, as nginx's ``send_timeout`` drops it. The request then ends as a disconnect:
its upstream stream is closed and the engine aborts the generation.

The transport and the hook are owned by their connection's protocol, on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_STATUS_LINE = b"HTTP/1.1 "
DISCONNECT_HOOK = "llmso.disconnect_hook"


class DisconnectHook:
    """One connection's disconnect notice: the request being served sets ``callback``
    (and clears it when done); ``lost`` says the connection is already gone. ``loop`` is
    the connection's event loop (``asyncio.current_task(loop)`` needs no lookup, which
    costs a ``getpid`` syscall on Python 3.11)."""

    __slots__ = ("callback", "loop", "lost")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.callback: Callable[[], None] | None = None
        self.lost = False
        self.loop = loop

    def fire(self) -> None:
        self.lost = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


class CoalescingTransport:
    """Proxy of one connection's transport; see the module docstring."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + bytes(data))
        elif type(data) is bytes and not data.startswith(_STATUS_LINE):
            self._transport.write(data)  # a body chunk: a stream's every write but its first
        elif data[:9] == _STATUS_LINE:
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def writelines(self, lines: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(lines))

    def flush(self) -> None:
        """Send held bytes now (the loop's next turn, a close, an EOF)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        # Reading flow control, extra info, buffer limits: the real transport's own.
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` HTTP/1.1 protocol on a ``CoalescingTransport``; with a
    ``send_timeout`` (``http_protocol``), a client that reads nothing for that long is
    dropped."""

    send_timeout: ClassVar[float | None] = None
    _stall: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        proxy: Any = CoalescingTransport(transport, loop)
        self._disconnect_hook = DisconnectHook(loop)
        super().connection_made(proxy)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        scope: Any = self.scope
        scope[DISCONNECT_HOOK] = self._disconnect_hook

    def connection_lost(self, exc: Exception | None) -> None:
        self._unstall()
        super().connection_lost(exc)
        self._disconnect_hook.fire()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.send_timeout is not None and self._stall is None:
            self._stall = self.loop.call_later(self.send_timeout, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unstall()

    def _unstall(self) -> None:
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    def _stalled(self) -> None:
        self._stall = None
        log.info(
            "client %s read nothing for %gs: connection dropped", self.client, self.send_timeout
        )
        self.transport.abort()


def http_protocol(send_timeout: float | None) -> type[CoalescingHttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, dropping a client that reads
    nothing for ``send_timeout`` seconds (None: never)."""
    if send_timeout is None:
        return CoalescingHttpToolsProtocol
    attributes = {"send_timeout": send_timeout}
    return type("CoalescingHttpToolsProtocol", (CoalescingHttpToolsProtocol,), attributes)
