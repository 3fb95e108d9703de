"""The admin mutations of the model registry, as values: what ``/admin/models/...`` and
the adapter routes do, so that a fleet's worker can apply the same one everywhere.

``run_admin`` applies an ``AdminAction`` to this worker's registry and, in a fleet,
broadcasts it to the other workers through the hub, which also keeps it for a worker
that starts later (``replay``). Outside a fleet it is the registry call and nothing more.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from backends.base import AdapterSpec
from gateway.edge.state import AppState
from gateway.fleet.wire import CallFailed
from gateway.registry import ModelRegistry, ModelStatus

log = logging.getLogger(__name__)

Op = Literal["load", "unload", "drain", "add_adapter", "remove_adapter"]


@dataclass(frozen=True, slots=True)
class AdminAction:
    """One mutation: ``op`` on ``model``; the adapter ops name the adapter too."""

    op: Op
    model: str
    adapter: str = ""
    source: str | None = None
    aliases: tuple[str, ...] = ()

    def wire(self) -> list[Any]:
        return [self.op, self.model, self.adapter, self.source, list(self.aliases)]

    @classmethod
    def of(cls, raw: list[Any]) -> AdminAction:
        op, model, adapter, source, aliases = raw
        return cls(op, model, adapter, source, tuple(aliases))


async def apply_action(registry: ModelRegistry, action: AdminAction) -> ModelStatus:
    """The action on this process's registry; raises what the registry raises."""
    if action.op == "load":
        return await registry.load(action.model)
    if action.op == "unload":
        return await registry.unload(action.model)
    if action.op == "drain":
        return registry.drain(action.model)
    if action.op == "add_adapter":
        spec = AdapterSpec(action.adapter, action.source, action.aliases)
        return await registry.add_adapter(action.model, spec)
    return await registry.remove_adapter(action.model, action.adapter)


@dataclass(frozen=True, slots=True)
class Applied:
    """An action's result here, and the other workers that failed it (fleet only)."""

    status: ModelStatus
    failures: tuple[str, ...] = ()


async def run_admin(state: AppState, action: AdminAction) -> Applied:
    """Apply here, then (in a fleet) on every other worker."""
    status = await apply_action(state.registry, action)
    if state.fleet is None:
        return Applied(status)
    try:
        failures = await state.fleet.broadcast("admin", action.wire())
    except (ConnectionError, TimeoutError, CallFailed) as exc:  # the hub is gone
        failures = [f"the fleet's hub: {type(exc).__name__}: {exc}"]
    for failure in failures:
        log.warning("admin %s %s: %s", action.op, action.model, failure)
    return Applied(status, tuple(failures))


async def replay(registry: ModelRegistry, actions: list[Any]) -> None:
    """A fresh worker catches up with the admin actions the fleet took before it."""
    for raw in actions:
        action = AdminAction.of(raw)
        try:
            await apply_action(registry, action)
        except Exception as exc:  # one stale action must not stop the worker
            log.warning("replaying admin %s %s: %s", action.op, action.model, exc)
