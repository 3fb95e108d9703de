"""How late this process's event loop runs: the gateway's own saturation signal.

A relay process serves every stream on one event loop, one core. Past what that core
can carry (measured on a 2-vCPU Xeon: ~650 GPU-speed streams of 50 chunks a second),
every callback waits for the ones queued before it, so every admitted stream slows
together, long before an in-flight count such as ``server.max_in_flight`` is reached:
how many streams a core carries depends on the host, the chunk rate and the features in
use, so no fixed count is right everywhere. The loop's lateness is the direct measure.

``LoopLag.run`` sleeps ``interval`` seconds at a time and notes how much later than asked
each sleep woke: the time the loop spent on other work before it got back. ``lagging``
is true while the median of the last ``window`` notes is above ``limit``: a sustained
backlog (every note late), not one long pause (a collection, a blocking call), which
moves one note only. The front door sheds new requests while it is true
(``gateway.edge.door``); ``seconds`` (that median) is the ``llmso_event_loop_lag_seconds``
gauge.

Owned by the app's event loop: ``run`` (one task, for the app's lifetime) is the only
writer, and ``lagging`` and ``seconds`` are read on the same loop.
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
        """Seconds of lag above which the loop counts as ``lagging``; None: never."""
        self.interval = interval
        self._notes: deque[float] = deque(maxlen=window)
        self._observe = observe
        self.seconds = 0.0
        """The median of the last notes: how late the loop runs now."""
        self.lagging = False

    def note(self, late: float) -> None:
        """Take one note of lateness (seconds); ``run`` calls it each interval."""
        self._notes.append(max(0.0, late))
        self.seconds = statistics.median(self._notes)
        self.lagging = self.limit is not None and self.seconds > self.limit
        if self._observe is not None:
            self._observe(self.seconds)

    async def run(self) -> None:
        """Sample until cancelled."""
        clock = time.perf_counter
        while True:
            asked = clock() + self.interval
            await asyncio.sleep(self.interval)
            self.note(clock() - asked)
