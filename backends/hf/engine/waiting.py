"""The continuous scheduler's waiting queue: priority first, with aging, then weighted
fair share between client keys (``backends.fair_queue``).

A priority level's urgency is its oldest request's ``queued_at + priority * AGING`` (lower
first; a client key's ``high`` is -1, ``normal`` 0, ``low`` 1, and a request may ask
for its own within its key's range). So a high request overtakes the normal ones that
arrived up to ``AGING`` seconds before it, and the low level never waits behind high
requests that arrived more than ``2 * AGING`` seconds after its oldest: low priority is
served later, never starved.
Within a level the key with the least weighted work goes first: after every step the
scheduler charges each request's ``tenant`` (``charge``, divided by its weight) the
sequence slots it held in that step, one per decoding choice and one per choice of a
request whose prompt chunk ran. Slot-steps, not tokens: requests wait here only when the
slots (or a step's token budget) are taken, and a slot is held for a step whether it
decodes one token or prefills a chunk of hundreds; counting tokens charged a short
question with a long prompt several times its share of the slots (measured: a key
sending 40-token prompts for 4-token answers, one every two steps, waited ever longer
beside a key holding the slots with 64-token answers; in slot-steps it waits for one
free slot). So one key's burst takes its share of the slots that free up, not all of
them; with one key (or no keys) the level is first come, first served.

Ordering alone cannot help a request once every sequence slot is taken: without
preemption it would wait for a running request to finish, and one key's long answers
can hold every slot for as long as they take. So ``held_back`` keeps
``max(1, max_num_seqs // 8)`` slots free of

- normal and low requests, while high-priority requests are about (one arrived in the
  last ``HIGH_WINDOW`` seconds);
- a key's requests while another key that holds fewer slots is about (one of its
  requests arrived in the last ``HIGH_WINDOW`` seconds): the key with the most slots
  never takes the last ones, so the other key's next request finds one free.

With no high traffic and one key, every slot serves everyone.

Owned by the engine thread, like the scheduler that holds it. Bounded by the backend's
``max_queue`` (the backend refuses beyond it, low priority first: ``shed_limit``).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping

from backends.base import Tenant
from backends.fair_queue import FairQueue
from backends.hf.engine.sequence import RequestState

AGING = 10.0
"""Seconds of waiting one priority step is worth."""

HIGH_WINDOW = 30.0
"""Seconds after a high-priority arrival (another key's arrival) during which slots are
held back for high (for the key that holds fewer)."""

_SHED_SHARE = {-1: 1.0, 0: 1.0, 1: 0.5}


def shed_limit(max_queue: int, priority: int) -> int:
    """Waiting requests beyond which a new request of ``priority`` is refused (429):
    under overload low priority is shed first (at half of ``max_queue``); normal and
    high use the whole queue, where high is then served first."""
    share = _SHED_SHARE.get(max(-1, min(1, priority)), 1.0)
    return max(1, int(max_queue * share))


class WaitingQueue:
    """See the module doc: a ``FairQueue`` of ``RequestState`` plus the hold-backs."""

    def __init__(self) -> None:
        self._line: FairQueue[RequestState] = FairQueue(aging=AGING)
        self._last_high = -HIGH_WINDOW
        # Each key's last arrival (time.monotonic()), oldest first; only the last
        # HIGH_WINDOW seconds are kept.
        self._seen: OrderedDict[str, float] = OrderedDict()

    def append(self, state: RequestState) -> None:
        request = state.request
        now = time.monotonic()
        if request.priority < 0:
            self._last_high = now
        self._seen[request.tenant.name] = now
        self._seen.move_to_end(request.tenant.name)
        while next(iter(self._seen.values())) < now - HIGH_WINDOW:
            self._seen.popitem(last=False)
        self._line.push(
            state, priority=request.priority, tenant=request.tenant, queued_at=state.queued_at
        )

    def held_back(self, state: RequestState, max_seqs: int, holding: Mapping[str, int]) -> int:
        """Slots ``state`` may not take (see the module doc); ``holding``: the slots each
        key's running requests hold."""
        if max_seqs < 2:
            return 0
        now = time.monotonic()
        request = state.request
        if request.priority >= 0 and now - self._last_high <= HIGH_WINDOW:
            return max(1, max_seqs // 8)
        mine = holding.get(request.tenant.name, 0)
        if mine and any(
            holding.get(name, 0) < mine
            for name, seen in self._seen.items()
            if name != request.tenant.name and now - seen <= HIGH_WINDOW
        ):
            return max(1, max_seqs // 8)
        return 0

    def charge(self, tenant: Tenant, slot_steps: int) -> None:
        """Slot-steps ``tenant``'s requests held in a step, against its share."""
        self._line.charge(tenant, slot_steps)

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
