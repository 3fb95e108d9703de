"""The supervisor's hub: the UNIX socket every worker keeps one channel open to.

What goes through it:

- ``hello``: a worker (re)started; the hub seats it and answers with the admin actions
  recorded so far, which the worker replays, so a replacement for a crashed worker
  serves the same models as the others;
- ``gather``: a call run by every live worker, one reply each (the one ``/metrics``, the
  console's views, ``/admin/usage``): the worker that got the HTTP request merges them;
- ``broadcast``: a call run by every other worker (an admin action: load, unload, drain,
  adapters); admin actions are also recorded for replay (the newest ``MAX_ACTIONS``);
- the shared stores' calls, when the hub serves them (``SharedStores``).

A worker that does not answer a gather within ``GATHER_TIMEOUT`` is left out of it and
logged. ``Hub`` is owned by the supervisor's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from typing import Any

from gateway.fleet.link import GATHER_TIMEOUT
from gateway.fleet.stores import SharedStores
from gateway.fleet.wire import CallFailed, Channel

log = logging.getLogger(__name__)

MAX_ACTIONS = 1024
"""Admin actions kept for replay; older ones are forgotten (a newer one usually
supersedes them: a load after an unload of the same model)."""


@dataclass(slots=True)
class _Worker:
    index: int
    pid: int
    channel: Channel


class Hub:
    """See the module docstring."""

    def __init__(self, stores: SharedStores) -> None:
        self.stores = stores
        self.workers: dict[int, _Worker] = {}
        self.actions: deque[Any] = deque(maxlen=MAX_ACTIONS)
        self.joined = 0  # hellos so far: 0 means no worker ever came up
        self._server: asyncio.AbstractServer | None = None
        self._channels: set[Channel] = set()

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._accept, path=path)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for channel in list(self._channels):
            await channel.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        holder: list[Channel] = []

        async def handle(op: str, body: Any) -> Any:
            return await self._handle(holder[0], op, body)

        channel = Channel(reader, writer, handle, name="fleet-hub")
        holder.append(channel)
        self._channels.add(channel)
        await channel.closed.wait()
        self._channels.discard(channel)
        for index, worker in list(self.workers.items()):
            if worker.channel is channel:
                del self.workers[index]

    async def _handle(self, channel: Channel, op: str, body: Any) -> Any:
        if self.stores.serves(op):
            return await self.stores.handle(op, body)
        if op == "hello":
            self.workers[body["worker"]] = _Worker(body["worker"], body["pid"], channel)
            self.joined += 1
            log.info("worker %d (pid %d) joined", body["worker"], body["pid"])
            return {"actions": list(self.actions)}
        if op == "gather":
            answers = await self._ask_all(body["op"], body["body"], skip=None)
            return [answer for answer in answers if "body" in answer]
        if op == "broadcast":
            if body["op"] == "admin":
                self.actions.append(body["body"])
            answers = await self._ask_all(body["op"], body["body"], skip=channel)
            return [f"worker {a['worker']}: {a['error']}" for a in answers if "error" in a]
        raise CallFailed(f"the hub serves no {op!r}")

    async def _ask_all(self, op: str, body: Any, *, skip: Channel | None) -> list[dict[str, Any]]:
        targets = [w for w in self.workers.values() if w.channel is not skip]
        return list(await asyncio.gather(*(self._ask(worker, op, body) for worker in targets)))

    async def _ask(self, worker: _Worker, op: str, body: Any) -> dict[str, Any]:
        """``{worker, pid, body}``, or ``{worker, pid, error}`` (logged)."""
        seat = {"worker": worker.index, "pid": worker.pid}
        try:
            async with asyncio.timeout(GATHER_TIMEOUT):
                return {**seat, "body": await worker.channel.call(op, body)}
        except (CallFailed, TimeoutError, ConnectionError) as exc:
            error = str(exc) if isinstance(exc, CallFailed) else f"no answer ({type(exc).__name__})"
            log.warning("worker %d: %r failed: %s", worker.index, op, error)
            return {**seat, "error": error}
