"""How much CPU other processes took from a measurement: the machine's busy time
(``/proc/stat``) minus that of the processes under test (``/proc/PID/stat``), in cores.

A latency check that predicts from an earlier calibration assumes the machine is as free
during the check as it was then; this tells a test when that did not hold. Linux only;
elsewhere the share reads as 0.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _machine_busy() -> int:
    """Busy jiffies of all CPUs: user, nice, system, irq, softirq, steal (not idle/iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return user + nice + system + irq + softirq + steal


def _process_busy(pid: int) -> int:
    """utime + stime of one process (all its threads), in jiffies; 0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


class ForeignCpu:
    """Measures, between ``start()`` and ``stop()``, the cores used by processes other
    than ``pids``. Owned by the test that made it."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._pids = tuple(pids)
        self._start: tuple[float, int, int] | None = None
        self.cores = 0.0

    def _sample(self) -> tuple[float, int, int]:
        own = sum(_process_busy(pid) for pid in self._pids)
        return time.monotonic(), _machine_busy(), own

    def start(self) -> None:
        if Path("/proc/stat").exists():
            self._start = self._sample()

    def stop(self) -> float:
        if self._start is None:
            return 0.0
        t0, busy0, own0 = self._start
        t1, busy1, own1 = self._sample()
        foreign = max(0, (busy1 - busy0) - (own1 - own0))
        self.cores = foreign / _TICK / max(t1 - t0, 1e-3)
        return self.cores
