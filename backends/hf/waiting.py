"""The continuous scheduler's waiting queue: priority first, then arrival, with aging.

A request's place is ``queued_at + priority * AGING`` (lower first; a client key's
``high`` is -1, ``normal`` 0, ``low`` 1). So a high request overtakes the normal ones
that arrived up to ``AGING`` seconds before it, and no request waits behind one that
arrived more than ``2 * AGING`` seconds after it: low priority is served later, never
starved. The key is fixed at arrival, so the order never needs re-sorting.

Owned by the engine thread, like the scheduler that holds it. Bounded by the backend's
``max_queue`` (the backend refuses beyond it, low priority first: ``shed_limit``).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator

from backends.hf.sequence import RequestState

AGING = 10.0
"""Seconds of waiting one priority step is worth."""

_SHED_SHARE = {-1: 1.0, 0: 0.85, 1: 0.5}


def shed_limit(max_queue: int, priority: int) -> int:
    """Waiting requests beyond which a new request of ``priority`` is refused (429):
    under overload low priority is shed first, then normal, high last."""
    share = _SHED_SHARE.get(max(-1, min(1, priority)), 1.0)
    return max(1, int(max_queue * share))


class WaitingQueue:
    """Sorted by ``(queued_at + priority * AGING, arrival order)``; see the module doc."""

    def __init__(self) -> None:
        self._items: list[tuple[float, int, RequestState]] = []
        self._order = itertools.count()

    def append(self, state: RequestState) -> None:
        rank = state.queued_at + state.request.priority * AGING
        bisect.insort(self._items, (rank, next(self._order), state), key=lambda e: e[:2])

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
