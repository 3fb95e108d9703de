"""CPU seconds used by a server under test, read from ``/proc`` (Linux only).

A server may be several processes (vLLM starts an engine-core child), so the unit measured is
the process group the harness created with ``start_new_session=True``: the sum of user and
system time of every live process in it, plus children it has already reaped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

_PROC = Path("/proc")


def _stat_ticks(text: str) -> tuple[int, int, int, int, int]:
    """(pgrp, utime, stime, cutime, cstime) from a ``/proc/<pid>/stat`` line."""
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); pgrp is field 5, utime..cstime are fields 14..17.
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return int(fields[2]), utime, stime, cutime, cstime


def _parse_stat(text: str) -> tuple[int, int, int]:
    """(pgrp, user+system ticks, reaped children's ticks) from a ``/proc/<pid>/stat`` line."""
    pgrp, utime, stime, cutime, cstime = _stat_ticks(text)
    return pgrp, utime + stime, cutime + cstime


def process_cpu_seconds(pid: int) -> float | None:
    """User+system CPU seconds of one process (with reaped children); ``None`` if gone."""
    try:
        _, own, children = _parse_stat((_PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return (own + children) / os.sysconf("SC_CLK_TCK")


def _group_members(pgid: int) -> Iterator[tuple[Path, tuple[int, int, int, int, int]]]:
    """``/proc/<pid>`` and its ticks for every live process whose process group is ``pgid``."""
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ticks = _stat_ticks((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
        if ticks[0] == pgid:
            yield entry, ticks


def group_cpu_split(pgid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds summed over process group ``pgid``, reaped children
    included; ``None`` if no process is in it."""
    user = system = 0
    found = False
    for _, (_, utime, stime, cutime, cstime) in _group_members(pgid):
        found = True
        user += utime + cutime
        system += stime + cstime
    tick = os.sysconf("SC_CLK_TCK")
    return (user / tick, system / tick) if found else None


def group_cpu_seconds(pgid: int) -> float | None:
    """Sum over every live process whose process group is ``pgid``; ``None`` if none is."""
    split = group_cpu_split(pgid)
    return None if split is None else split[0] + split[1]


class CpuWindow:
    """CPU seconds a server spends between ``start()`` (called by ``run_level`` after the
    warm-up) and ``seconds()``; ``read`` gives its running total, ``None`` if unknown."""

    def __init__(self, read: Callable[[], float | None]) -> None:
        self._read = read
        self._start: float | None = None

    def start(self) -> None:
        self._start = self._read()

    def seconds(self) -> float | None:
        end = self._read()
        return None if self._start is None or end is None else end - self._start
