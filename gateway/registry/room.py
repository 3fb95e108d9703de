"""Memory under the budget: making room before a load (which models to drain, and when
to give up) and checking it after. Acts through ``Tenants`` (what ``Lifecycle`` offers);
runs on the event loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from backends.base import Backend
from backends.errors import NotReady
from config.schema import AppConfig
from gateway.registry.entry import Entry
from gateway.registry.eviction import Resident, busy_victim, fits, idle_victim
from gateway.registry.tasks import join

log = logging.getLogger(__name__)


class Tenants(Protocol):
    """The loaded models as room-making sees them (``lifecycle.Lifecycle``)."""

    @property
    def config(self) -> AppConfig: ...

    def used_bytes(self) -> int: ...

    def entries(self) -> list[Entry]: ...

    def entry(self, name: str) -> Entry | None: ...

    def pending_drains(self) -> list[asyncio.Task[None]]: ...

    def start_drain(self, entry: Entry, reason: str) -> asyncio.Task[None]: ...


async def make_room(life: Tenants, entry: Entry, needed: int) -> None:
    """Return once ``needed`` bytes fit the budget: drain idle models (LRU first), wait
    for drains under way, then drain busy models. Raises ``NotReady`` when nothing can
    be freed; the caller's load timeout bounds the waiting."""
    budget = life.config.registry.memory_budget_bytes
    if budget is None or needed == 0:
        return
    if needed > budget:
        raise NotReady(f"needs {needed} bytes; the memory budget is {budget}")
    while not fits(life.used_bytes(), needed, budget):
        residents = _residents(life.entries())
        victim = idle_victim(residents, entry.name)
        if victim is not None:
            log.info("evicting idle %s (least recently used) to load %s", victim, entry.name)
            await join(life.start_drain(_named(life, victim), "memory"))
            continue
        pending = life.pending_drains()
        if pending:
            await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
            continue
        victim = busy_victim(residents, entry.name)
        if victim is not None:
            log.info("draining busy %s (least recently used) to load %s", victim, entry.name)
            life.start_drain(_named(life, victim), "memory")
            continue
        raise NotReady(
            f"not enough memory: needs {needed} bytes, {life.used_bytes()} of {budget} "
            "held by models that cannot be evicted now"
        )


def _named(life: Tenants, name: str) -> Entry:
    found = life.entry(name)
    assert found is not None, f"victim {name} is not in the table"
    return found


def _residents(entries: list[Entry]) -> list[Resident]:
    return [
        Resident(e.name, e.state, e.instance.reserved_bytes, e.instance.inflight, e.last_used_mono)
        for e in entries
        if e.instance is not None
    ]


def reported_memory(backend: Backend) -> int | None:
    """What a loaded backend says it holds (None if it cannot say, or fails to)."""
    try:
        return backend.info().memory_bytes
    except Exception:
        return None


def warn_if_over_budget(life: Tenants, loaded: str) -> None:
    budget = life.config.registry.memory_budget_bytes
    if budget is not None and life.used_bytes() > budget:
        log.warning(
            "memory budget exceeded after loading %s: the model reports more than "
            "estimated; later loads will evict",
            loaded,
        )
