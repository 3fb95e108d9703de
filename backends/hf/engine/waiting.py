"""The continuous scheduler's waiting queue: priority first, then arrival, with aging.

A request's place is ``queued_at + priority * AGING`` (lower first; a client key's
``high`` is -1, ``normal`` 0, ``low`` 1). So a high request overtakes the normal ones
that arrived up to ``AGING`` seconds before it, and no request waits behind one that
arrived more than ``2 * AGING`` seconds after it: low priority is served later, never
starved. The key is fixed at arrival, so the order never needs re-sorting.

Ordering alone cannot help a high request once every sequence slot is taken: without
preemption it would wait for a running request to finish. So while high-priority
requests are about (one arrived in the last ``HIGH_WINDOW`` seconds), ``held_back`` keeps
``max(1, max_num_seqs // 8)`` slots free of normal and low requests; with no high
traffic every slot serves everyone.

Owned by the engine thread, like the scheduler that holds it. Bounded by the backend's
``max_queue`` (the backend refuses beyond it, low priority first: ``shed_limit``).
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Iterator

from backends.hf.engine.sequence import RequestState

AGING = 10.0
"""Seconds of waiting one priority step is worth."""

HIGH_WINDOW = 30.0
"""Seconds after a high-priority arrival during which slots are held back for high."""

_SHED_SHARE = {-1: 1.0, 0: 1.0, 1: 0.5}


def shed_limit(max_queue: int, priority: int) -> int:
    """Waiting requests beyond which a new request of ``priority`` is refused (429):
    under overload low priority is shed first (at half of ``max_queue``); normal and
    high use the whole queue, where high is then served first."""
    share = _SHED_SHARE.get(max(-1, min(1, priority)), 1.0)
    return max(1, int(max_queue * share))


class WaitingQueue:
    """Sorted by ``(queued_at + priority * AGING, arrival order)``; see the module doc."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, RequestState]] = []
        self._order = itertools.count()
        self._last_high = -HIGH_WINDOW

    def append(self, state: RequestState) -> None:
        if state.request.priority < 0:
            self._last_high = time.monotonic()
        rank = state.queued_at + state.request.priority * AGING
        bisect.insort(self._items, (rank, next(self._order), state), key=lambda e: e[:2])

    def held_back(self, state: RequestState, max_seqs: int) -> int:
        """Slots ``state`` may not take: kept for high priority while it is about."""
        if state.request.priority < 0 or max_seqs < 2:
            return 0
        if time.monotonic() - self._last_high > HIGH_WINDOW:
            return 0
        return max(1, max_seqs // 8)

    def popleft(self) -> RequestState:
        return self._items.pop(0)[2]

    def remove(self, state: RequestState) -> None:
        for index, (_, _, item) in enumerate(self._items):
            if item is state:
                del self._items[index]
                return
        raise ValueError("not waiting")

    def __getitem__(self, index: int) -> RequestState:
        return self._items[index][2]

    def __contains__(self, state: object) -> bool:
        return any(item is state for _, _, item in self._items)

    def __iter__(self) -> Iterator[RequestState]:
        return iter([item for _, _, item in self._items])

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)
