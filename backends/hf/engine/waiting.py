"""The continuous scheduler's waiting queue: priority first, with aging, then weighted
fair share between client keys (``backends.fair_queue``).

A priority level's urgency is its oldest request's ``queued_at + priority * AGING`` (lower
first; a client key's ``high`` is -1, ``normal`` 0, ``low`` 1, and a request may ask
for its own within its key's range). So a high request overtakes the normal ones that
arrived up to ``AGING`` seconds before it, and the low level never waits behind high
requests that arrived more than ``2 * AGING`` seconds after its oldest: low priority is
served later, never starved.
Within a level the key with the least weighted work goes first: the scheduler charges
every token it computes (prompt chunks and decoded tokens; prefix-cache hits are free) to
the request's ``tenant`` (``charge``), divided by its weight. So one key's burst takes
its share of the slots that free up, not all of them; with one key (or no keys) the
level is first come, first served.

Ordering alone cannot help a high request once every sequence slot is taken: without
preemption it would wait for a running request to finish. So while high-priority
requests are about (one arrived in the last ``HIGH_WINDOW`` seconds), ``held_back`` keeps
``max(1, max_num_seqs // 8)`` slots free of normal and low requests; with no high
traffic every slot serves everyone.

Owned by the engine thread, like the scheduler that holds it. Bounded by the backend's
``max_queue`` (the backend refuses beyond it, low priority first: ``shed_limit``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from backends.base import Tenant
from backends.fair_queue import FairQueue
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
    """See the module doc: a ``FairQueue`` of ``RequestState`` plus the high-priority
    hold-back."""

    def __init__(self) -> None:
        self._line: FairQueue[RequestState] = FairQueue(aging=AGING)
        self._last_high = -HIGH_WINDOW

    def append(self, state: RequestState) -> None:
        request = state.request
        if request.priority < 0:
            self._last_high = time.monotonic()
        self._line.push(
            state, priority=request.priority, tenant=request.tenant, queued_at=state.queued_at
        )

    def held_back(self, state: RequestState, max_seqs: int) -> int:
        """Slots ``state`` may not take: kept for high priority while it is about."""
        if state.request.priority < 0 or max_seqs < 2:
            return 0
        if time.monotonic() - self._last_high > HIGH_WINDOW:
            return 0
        return max(1, max_seqs // 8)

    def charge(self, tenant: Tenant, tokens: int) -> None:
        """``tokens`` computed for ``tenant``'s requests (prompt or output), against its
        share."""
        self._line.charge(tenant, tokens)

    def peek(self) -> RequestState:
        return self._line.peek()

    def popleft(self) -> RequestState:
        return self._line.pop()

    def remove(self, state: RequestState) -> None:
        self._line.remove(state)

    def __contains__(self, state: object) -> bool:
        return state in self._line

    def __iter__(self) -> Iterator[RequestState]:
        """Every waiting request, in no particular order."""
        return iter(self._line)

    def __len__(self) -> int:
        return len(self._line)

    def __bool__(self) -> bool:
        return bool(self._line)
