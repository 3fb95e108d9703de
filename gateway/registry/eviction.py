"""Pure victim choice for the memory budget: least recently used idle models first.

The registry asks repeatedly (one victim at a time, re-checking the budget after each),
so these functions only need to rank what is there now.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.registry.values import ModelState


@dataclass(frozen=True, slots=True)
class Resident:
    """One model holding memory, as the eviction policy sees it."""

    name: str
    state: ModelState
    memory_bytes: int
    inflight: int
    last_used: float


def fits(used: int, needed: int, budget: int | None) -> bool:
    return budget is None or used + needed <= budget


def idle_victim(residents: Iterable[Resident], exclude: str) -> str | None:
    """The least recently used ready model with nothing in flight that frees memory."""
    idle = [
        r
        for r in residents
        if r.name != exclude
        and r.state is ModelState.READY
        and r.inflight == 0
        and r.memory_bytes > 0
    ]
    return min(idle, key=lambda r: r.last_used).name if idle else None


def busy_victim(residents: Iterable[Resident], exclude: str) -> str | None:
    """The least recently used serving model to drain (new leases refused, in-flight ones
    finish) when no idle model is left."""
    busy = [
        r
        for r in residents
        if r.name != exclude
        and r.state in (ModelState.READY, ModelState.ACTIVE)
        and r.memory_bytes > 0
    ]
    return min(busy, key=lambda r: r.last_used).name if busy else None
