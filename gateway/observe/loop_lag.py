"""How late this process's event loop runs: the gateway's own saturation signal.

A relay process serves every stream on one event loop, one core. Past what that core
can carry (measured on a 2-vCPU Xeon: ~650 GPU-speed streams of 50 chunks a second),
every callback waits for the ones queued before it, so every admitted stream slows
together, long before an in-flight count such as ``server.max_in_flight`` is reached:
how many streams a core carries depends on the host, the chunk rate and the features in
use, so no fixed count is right everywhere. The loop's lateness is the direct measure.

``LoopLag.run`` sleeps ``interval`` seconds at a time and notes how much later than asked
each sleep woke: the time the loop spent on other work before it got back. ``seconds``,
the median of the last ``window`` notes, is the ``llmso_event_loop_lag_seconds`` gauge: a
sustained backlog (every note late) moves it, one long pause (a collection, a blocking
call) moves one note only. Past ``limit`` the front door sheds that ``share`` of new
requests (``gateway.edge.door``): ``(seconds - limit) / limit``, all of them from twice
the limit. Shedding in proportion holds the lag near the limit and turns fewer requests
away than shedding every one while past it, which emptied the core while the median came
back down (``bench/studies/shed_lag.py`` at 6fcfee6: 260 requests served a second at a
25 ms limit, the loop 9 ms late; in proportion, 332 and 19 ms).

Owned by the app's event loop: ``run`` (one task, for the app's lifetime) is the only
writer, and ``share`` and ``seconds`` are read on the same loop.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from collections.abc import Callable


class LoopLag:
    """The event loop's lateness, sampled (see the module docstring)."""

    def __init__(
        self,
        limit: float | None,
        *,
        interval: float = 0.025,
        window: int = 8,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.limit = limit
        """Seconds of lag past which a share of new requests is shed; None: never."""
        self.interval = interval
        self._notes: deque[float] = deque(maxlen=window)
        self._observe = observe
        self.seconds = 0.0
        """The median of the last notes: how late the loop runs now."""
        self.share = 0.0
        """The share of new requests to shed now, 0 to 1."""

    def note(self, late: float) -> None:
        """Take one note of lateness (seconds); ``run`` calls it each interval."""
        self._notes.append(max(0.0, late))
        self.seconds = statistics.median(self._notes)
        limit = self.limit
        self.share = 0.0 if limit is None else min(1.0, max(0.0, self.seconds / limit - 1))
        if self._observe is not None:
            self._observe(self.seconds)

    async def run(self) -> None:
        """Sample until cancelled."""
        clock = time.perf_counter
        while True:
            asked = clock() + self.interval
            await asyncio.sleep(self.interval)
            self.note(clock() - asked)
