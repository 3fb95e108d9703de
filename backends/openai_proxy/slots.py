"""``SlotGate``: at most ``max_concurrency`` requests in flight to the upstream; more wait
a bounded time in a bounded line, else ``Overloaded``. The line is a ``FairQueue``: a
freed slot goes to the most urgent priority (with aging, like the hf engine's queue), and
within it to the client key with the fewest requests let through, divided by its weight
(one per request: the gate cannot see how long an answer will take before it comes), so
one key's burst takes its share of the slots, not all of them. Owned by the backend's
event loop."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from backends.base import NO_TENANT, Overloaded, Tenant
from backends.fair_queue import FairQueue
from config.schema import OpenAIModelConfig

AGING = 10.0
"""Seconds of waiting one priority step is worth (as ``backends.hf.engine.waiting``)."""


@dataclass(eq=False, slots=True)
class _Waiter:
    tenant: Tenant
    granted: asyncio.Future[None]


class SlotGate:
    """``take`` one slot, ``free`` it. Two methods, not an ``@asynccontextmanager``: one is
    taken per request, and a generator-based context costs several times more. A freed
    slot passes straight to the waiter served next."""

    __slots__ = ("_config", "_free", "_line")

    def __init__(self, config: OpenAIModelConfig) -> None:
        self._config = config
        self._free = config.max_concurrency  # None: no limit, no line
        self._line: FairQueue[_Waiter] = FairQueue(aging=AGING)

    async def take(self, priority: int = 0, tenant: Tenant = NO_TENANT) -> None:
        """Hold one slot; wait at most ``queue_timeout`` behind at most ``max_queue``."""
        if self._free is None:
            return
        if self._free > 0 and not self._line:
            self._free -= 1
            self._line.served_at_once(tenant)
            self._line.charge(tenant, 1.0)
            return
        config = self._config
        if len(self._line) >= config.max_queue:
            raise Overloaded(f"model {config.name!r}: too many waiting requests")
        waiter = _Waiter(tenant, asyncio.get_running_loop().create_future())
        self._line.push(waiter, priority=priority, tenant=tenant, queued_at=time.monotonic())
        try:
            async with asyncio.timeout(config.queue_timeout):
                await waiter.granted
        except BaseException as exc:
            self._give_up(waiter)
            if isinstance(exc, TimeoutError):
                raise Overloaded(
                    f"model {config.name!r}: no free upstream slot within {config.queue_timeout:g}s"
                ) from None
            raise

    def free(self) -> None:
        if self._free is None:
            return
        while self._line:
            waiter = self._line.pop()
            if not waiter.granted.done():
                self._line.charge(waiter.tenant, 1.0)
                waiter.granted.set_result(None)
                return
        self._free += 1

    def _give_up(self, waiter: _Waiter) -> None:
        """A waiter that timed out or was cancelled leaves the line; a slot granted to it
        as it gave up passes on."""
        if waiter in self._line:
            self._line.remove(waiter)
        elif waiter.granted.done() and not waiter.granted.cancelled():
            self.free()
