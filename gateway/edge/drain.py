"""Graceful shutdown for rolling updates: drain, then stop.

On SIGTERM the gateway does not stop at once. ``/ready`` answers 503 immediately, so
the load balancer (a Kubernetes Service) takes this pod out of rotation; but the
endpoint takes a few seconds to disappear everywhere, so new requests are still served
for ``server.drain_grace`` seconds, each answered with ``Connection: close`` so no
client keeps an idle keep-alive connection to a pod that is going away. Then uvicorn's
own shutdown runs: the listener closes and in-flight requests (long streams) get up
to ``server.drain_timeout`` seconds to finish before they are cancelled. A second
SIGTERM, or SIGINT (Ctrl-C), skips the grace period.

``Drain`` is the one flag; it is written by the signal handler (main thread, a plain
attribute store) and read by request handlers on the event loop of the same thread.

A worker of ``llmso serve --workers N`` runs ``SupervisedServer``: the same drain, told
by its supervisor (``gateway.fleet.supervisor``) with SIGUSR1 (a first SIGTERM) and
SIGUSR2 (a second one), or started by itself when the supervisor is gone.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn

log = logging.getLogger(__name__)

_CLOSE = (b"connection", b"close")


class Drain:
    """Whether this process is draining, and since when (``time.monotonic()``)."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None

    @property
    def draining(self) -> bool:
        return self.since is not None

    def begin(self) -> None:
        if self.since is None:
            self.since = time.monotonic()


class CloseWhileDraining:
    """ASGI wrapper: while draining, every HTTP response carries ``Connection: close``.
    Costs one attribute read per request otherwise."""

    def __init__(self, app: Callable[..., Awaitable[None]], drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(
        self, scope: dict[str, Any], receive: Any, send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] != "http" or not self.drain.draining:
            await self.app(scope, receive, send)
            return

        async def closing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), _CLOSE]
            await send(message)

        await self.app(scope, receive, closing)


class DrainingServer(uvicorn.Server):
    """``uvicorn.Server`` whose first SIGTERM starts a drain of ``grace`` seconds."""

    def __init__(self, config: uvicorn.Config, drain: Drain, grace: float) -> None:
        super().__init__(config)
        self._drain = drain
        self._grace = grace

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and not self._drain.draining and self._grace > 0:
            self._drain.begin()
            log.info("SIGTERM: draining; /ready is 503, serving for %.1fs more", self._grace)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        since = self._drain.since
        if since is not None and not self.should_exit and time.monotonic() - since >= self._grace:
            log.info("drain grace over: closing the listener, letting requests finish")
            self.should_exit = True
        return await super().on_tick(counter)


class SupervisedServer(DrainingServer):
    """A fleet worker's server: SIGUSR1 drains as a first SIGTERM does, SIGUSR2 stops
    as a second does; SIGTERM and SIGINT themselves are ignored, so a signal sent to the
    whole process group (Ctrl-C, systemd, a test harness) reaches each worker once,
    through the supervisor. ``supervisor_lost`` (on the loop) drains as SIGTERM would."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handlers: dict[signal.Signals, Any] = {
            signal.SIGUSR1: self._on_drain,
            signal.SIGUSR2: self._on_stop,
            signal.SIGTERM: signal.SIG_IGN,
            signal.SIGINT: signal.SIG_IGN,
        }
        previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_drain(self, sig: int, frame: FrameType | None) -> None:
        self.handle_exit(signal.SIGTERM, frame)

    def _on_stop(self, sig: int, frame: FrameType | None) -> None:
        self._drain.begin()
        self.should_exit = True

    def supervisor_lost(self) -> None:
        self.handle_exit(signal.SIGTERM, None)
