"""A worker's side of the fleet: its seat (which worker, of how many, where the hub is)
and its one channel to the supervisor's hub.

``Seat.from_environ`` reads what the supervisor put in the worker's environment
(``LLMSO_FLEET_HUB``, ``LLMSO_FLEET_WORKER``, ``LLMSO_WORKERS``); a process started any
other way has no seat and serves alone. ``FleetLink`` connects in the app's lifespan,
says hello (the hub answers with the admin actions a fresh worker must replay), and then
carries the worker's calls (``call``: limits and Responses store; ``gather``: one reply
per live worker, this one's too; ``broadcast``: to every other worker) and serves the
hub's calls with the handlers registered by ``serve``. When the hub goes away (the
supervisor died) ``on_lost`` runs once, and the worker drains.

Owned by the worker's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.fleet.wire import CallFailed, Channel, Handler

log = logging.getLogger(__name__)

HUB_ENV = "LLMSO_FLEET_HUB"
WORKER_ENV = "LLMSO_FLEET_WORKER"
WORKERS_ENV = "LLMSO_WORKERS"
SECRET_ENV = "LLMSO_FLEET_SEAL_SECRET"
GATHER_TIMEOUT = 5.0
"""Seconds the hub waits for each worker's reply to a gather or a broadcast."""


@dataclass(frozen=True, slots=True)
class Seat:
    """Where a worker sits: its index, the fleet's size and the hub's socket; and the
    key the fleet's workers sign thoughts with when the config names none."""

    hub: str
    worker: int
    workers: int
    seal_secret: str | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Seat | None:
        env = os.environ if environ is None else environ
        hub = env.get(HUB_ENV)
        if not hub:
            return None
        return cls(
            hub=hub,
            worker=int(env[WORKER_ENV]),
            workers=int(env[WORKERS_ENV]),
            seal_secret=env.get(SECRET_ENV),
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """One worker's answer to a gather."""

    worker: int
    pid: int
    body: Any


class FleetLink:
    """See the module docstring."""

    def __init__(self, seat: Seat) -> None:
        self.seat = seat
        self.on_lost: Callable[[], None] | None = None
        self._handlers: dict[str, Handler] = {}
        self._channel: Channel | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closing = False

    def serve(self, op: str, handler: Callable[[Any], Any]) -> None:
        """Answer the hub's calls of ``op`` with ``handler(body)`` (sync or async)."""

        async def run(body: Any) -> Any:
            result = handler(body)
            if asyncio.iscoroutine(result):
                return await result
            return result

        self._handlers[op] = lambda _op, body: run(body)

    async def connect(self) -> list[Any]:
        """Open the channel and say hello; returns the admin actions to replay."""
        reader, writer = await asyncio.open_unix_connection(self.seat.hub)
        self._channel = Channel(reader, writer, self._dispatch, name="fleet-link")
        hello = await self.call("hello", {"worker": self.seat.worker, "pid": os.getpid()})
        self._watch = asyncio.create_task(self._watch_hub(self._channel), name="fleet-watch")
        actions: list[Any] = hello["actions"]
        return actions

    async def call(self, op: str, body: Any = None, wait: float = 10.0) -> Any:
        """One call to the hub; raises ``ConnectionError``, ``CallFailed`` or
        ``TimeoutError`` (after ``wait`` seconds)."""
        channel = self._channel
        if channel is None:
            raise ConnectionError("not connected to the fleet hub")
        async with asyncio.timeout(wait):
            return await channel.call(op, body)

    async def gather(self, op: str, body: Any = None) -> list[Reply]:
        """``op`` run by every live worker (this one too), one reply each; a worker that
        did not answer in time is left out (logged by the hub)."""
        replies = await self.call("gather", {"op": op, "body": body}, GATHER_TIMEOUT + 2.0)
        return [Reply(r["worker"], r["pid"], r["body"]) for r in replies]

    async def broadcast(self, op: str, body: Any = None) -> list[str]:
        """``op`` run by every other worker; returns their failures as text."""
        failures: list[str] = await self.call(
            "broadcast", {"op": op, "body": body}, GATHER_TIMEOUT + 2.0
        )
        return failures

    async def answer(self, op: str, body: Any = None) -> Any:
        """What this worker answers the hub's ``op`` with, asked here directly."""
        return await self._dispatch(op, body)

    async def close(self) -> None:
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
        if self._channel is not None:
            await self._channel.close()

    async def _dispatch(self, op: str, body: Any) -> Any:
        handler = self._handlers.get(op)
        if handler is None:
            raise CallFailed(f"this worker serves no {op!r}")
        return await handler(op, body)

    async def _watch_hub(self, channel: Channel) -> None:
        await channel.closed.wait()
        if not self._closing:
            log.error("fleet hub went away (the supervisor died?); draining this worker")
            if self.on_lost is not None:
                self.on_lost()
