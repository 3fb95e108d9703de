"""A waiting line served by priority with aging, and by weighted fair share between
tenants (client keys) within one priority.

Used by the hf engine's waiting queue (``backends.hf.engine.waiting``) and the relay's
slot gate (``backends.openai_proxy.slots``). Which waiting item goes next:

1. **Priority, with aging.** A priority level's urgency is ``its oldest arrival +
   priority * aging`` seconds (lower first; vLLM's meaning of priority: lower runs
   first). With ``aging`` 10 s a level-0 request overtakes the level-1 ones that arrived
   up to 10 s before it, and a level-1 request never waits behind level-0 ones that
   arrived more than 10 s after it: a lower priority is served later, never starved.
   With a single tenant this is exactly "priority first, then arrival, with aging".
2. **Weighted fair share within the level.** Each tenant has a virtual counter: the
   work charged to it (``charge``; the hf engine charges the sequence slots the tenant's
   requests hold, step by step, the slot gate one per request it lets through) divided
   by its weight. The level serves the tenant with the lowest counter (ties: the tenant
   served least recently, then arrival); a tenant's own items go in arrival order. A
   tenant that starts waiting in a level is lifted to the lowest counter among the
   tenants already waiting there (none: the counter of the tenant served last), so idle
   time banks no credit: its later burst cannot starve the others, and a tenant that
   kept the engine busy alone cannot starve a newcomer. This is a virtual-counter scheme
   (start-time fair queuing with the cost measured as the work is done, which an LLM
   engine only learns as it goes).

Bounds: the owner bounds the items (``max_queue``). A tenant with waiting items is always
kept; of the idle ones at most ``max_idle_tenants`` are remembered (least recently
touched forgotten first): a forgotten tenant that comes back is lifted like a new one,
so forgetting can waive a debt but never grant credit.

Not thread-safe: owned by one thread or one event loop (the hf engine thread; the relay
backend's loop), like the structures that hold it.
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from backends.base import Tenant

T = TypeVar("T")

MAX_IDLE_TENANTS = 1024
"""Idle tenants (nothing waiting) whose counters are remembered."""


@dataclass(eq=False, slots=True)
class _Entry(Generic[T]):
    item: T
    priority: int
    tenant: str
    queued_at: float
    order: int

    @property
    def place(self) -> tuple[float, int]:
        return self.queued_at, self.order


@dataclass(slots=True)
class _Flow:
    """One tenant's share: its weighted work so far, when it was last served (a pick
    number; -1: never), and how many of its items wait (all levels)."""

    counter: float = 0.0
    served: int = -1
    waiting: int = 0


class FairQueue(Generic[T]):
    """See the module docstring. Items are told apart by identity."""

    def __init__(self, *, aging: float, max_idle_tenants: int = MAX_IDLE_TENANTS) -> None:
        if max_idle_tenants < 1:
            raise ValueError("max_idle_tenants must be at least 1")
        self._aging = aging
        self._max_idle = max_idle_tenants
        # priority -> tenant name -> that tenant's items in the level, by arrival
        self._levels: dict[int, dict[str, list[_Entry[T]]]] = {}
        self._flows: OrderedDict[str, _Flow] = OrderedDict()
        self._entries: dict[int, _Entry[T]] = {}  # id(item) -> its entry
        self._order = itertools.count()
        self._picks = itertools.count()
        self._virtual = 0.0  # the counter of the tenant served last, when it was served

    def push(self, item: T, *, priority: int, tenant: Tenant, queued_at: float) -> None:
        flow = self._touch(tenant.name)
        level = self._levels.setdefault(priority, {})
        line = level.get(tenant.name)
        if line is None:  # the tenant starts waiting in this level: no banked credit
            flow.counter = max(flow.counter, self._floor(level))
            line = level[tenant.name] = []
        entry = _Entry(item, priority, tenant.name, queued_at, next(self._order))
        bisect.insort(line, entry, key=lambda e: e.place)
        flow.waiting += 1
        self._entries[id(item)] = entry

    def peek(self) -> T:
        """The item served next; ``IndexError`` when none waits."""
        return self._head().item

    def pop(self) -> T:
        """Take the item served next; ``IndexError`` when none waits."""
        entry = self._head()
        self._discard(entry)
        flow = self._flows[entry.tenant]
        flow.served = next(self._picks)
        self._virtual = flow.counter
        return entry.item

    def remove(self, item: T) -> None:
        """Take ``item`` out of the line (it left before its turn); ``ValueError`` when
        it is not waiting."""
        entry = self._entries.get(id(item))
        if entry is None or entry.item is not item:
            raise ValueError("not waiting")
        self._discard(entry)

    def served_at_once(self, tenant: Tenant) -> None:
        """``tenant`` was served without waiting (nothing was): it counts as served now,
        as if popped (the tie-break between tenants at equal work)."""
        self._touch(tenant.name).served = next(self._picks)

    def charge(self, tenant: Tenant, work: float) -> None:
        """Count ``work`` done for ``tenant`` (slot-steps, or requests: the owner's unit)."""
        self._touch(tenant.name).counter += work / tenant.weight

    def counter(self, name: str) -> float | None:
        """The tenant's weighted work, ``None`` when it is not remembered (for tests)."""
        flow = self._flows.get(name)
        return None if flow is None else flow.counter

    @property
    def tenants(self) -> int:
        """Tenants remembered: those waiting, and at most ``max_idle_tenants`` idle."""
        return len(self._flows)

    def __contains__(self, item: object) -> bool:
        entry = self._entries.get(id(item))
        return entry is not None and entry.item is item

    def __iter__(self) -> Iterator[T]:
        """Every waiting item, in no particular order (``pop`` gives the order)."""
        return iter([entry.item for entry in self._entries.values()])

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    # ------------------------------------------------------------------ internals

    def _head(self) -> _Entry[T]:
        if not self._levels:
            raise IndexError("no item is waiting")
        _, level = min(self._levels.items(), key=self._urgency)
        flows = self._flows
        name = min(level, key=lambda n: (flows[n].counter, flows[n].served, level[n][0].order))
        return level[name][0]

    def _urgency(self, item: tuple[int, dict[str, list[_Entry[T]]]]) -> tuple[float, int]:
        priority, level = item
        queued_at, order = min(line[0].place for line in level.values())
        return queued_at + priority * self._aging, order

    def _floor(self, level: dict[str, list[_Entry[T]]]) -> float:
        return min((self._flows[name].counter for name in level), default=self._virtual)

    def _discard(self, entry: _Entry[T]) -> None:
        del self._entries[id(entry.item)]
        level = self._levels[entry.priority]
        line = level[entry.tenant]
        line.remove(entry)
        if not line:
            del level[entry.tenant]
            if not level:
                del self._levels[entry.priority]
        self._flows[entry.tenant].waiting -= 1

    def _touch(self, name: str) -> _Flow:
        """The tenant's flow, marked as just used (made, forgetting an idle one, if new)."""
        flow = self._flows.get(name)
        if flow is not None:
            self._flows.move_to_end(name)
            return flow
        flow = self._flows[name] = _Flow(counter=self._virtual)
        if len(self._flows) > self._max_idle:
            self._forget_idle(keep=name)
        return flow

    def _forget_idle(self, keep: str) -> None:
        """Forget the least recently touched idle tenants beyond the bound (O(tenants),
        only when a new tenant comes while the bound is reached)."""
        idle = [n for n, flow in self._flows.items() if not flow.waiting and n != keep]
        for name in idle[: max(0, len(idle) + 1 - self._max_idle)]:
            del self._flows[name]
