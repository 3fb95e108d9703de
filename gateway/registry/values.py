"""Plain values the registry hands out: states, statuses, leases, routes, config diffs."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from backends.base import Backend
from config.schema import ModelConfig


class ModelState(StrEnum):
    """``unloaded -> loading -> ready <-> active -> draining -> unloaded``, and ``failed``.

    ``active`` means ready with at least one request in flight. ``draining`` refuses new
    leases and waits for the in-flight ones before the backend stops. ``failed`` is a load
    failure or a crash; the model is retried after a backoff.
    """

    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    ACTIVE = "active"
    DRAINING = "draining"
    FAILED = "failed"


SERVING_STATES = frozenset({ModelState.READY, ModelState.ACTIVE})


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """A snapshot of one configured model, for ``/v1/models`` and the admin API.

    ``memory_bytes`` is the configured value, else what the loaded backend reports, else
    an estimate from the weight files (0 when unknown). Times are ``time.time()`` values.
    """

    name: str
    backend: str
    state: ModelState
    aliases: tuple[str, ...]
    capabilities: tuple[str, ...]
    priority: int
    pid: int | None
    memory_bytes: int
    inflight: int
    loaded_at: float | None
    last_used: float | None
    last_error: str | None
    owned_by: str
    max_context: int | None
    restarts: int
    retry_in: float | None
    replicas: tuple[dict[str, object], ...] = ()
    """Per upstream replica of a loaded replicated backend (``LiveReplicas``)."""
    adapters: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The model's LoRA adapters: each name with its aliases."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Permission to send requests to ``backend`` until the lease's context exits.

    ``config`` is the config the backend was started with: after a hot reload, a lease
    taken before it keeps the old backend and config until it ends.
    """

    name: str
    config: ModelConfig
    backend: Backend


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Models to try in order (the match, then fallbacks) and why the first one matched:
    ``exact``, ``alias``, ``capability``, ``adapter`` or ``split``."""

    candidates: tuple[str, ...]
    reason: str
    adapter: str | None = None
    """The LoRA adapter named (reason ``adapter``, or a split's target): served by its base
    model alone."""
    route: str | None = None
    """The split route requested (reason ``split``); ``target`` is the one it picked."""
    target: str | None = None

    @property
    def key_checks(self) -> tuple[str, ...]:
        """The names a client key's allow-list is checked against: the adapter, or each
        candidate model."""
        return self.candidates if self.adapter is None else (self.adapter,)


@dataclass(frozen=True, slots=True)
class ConfigDiff:
    """What a hot reload did, by model name.

    ``reloaded``: a backend-relevant field changed, so the model restarts on the new
    config. ``updated``: only routing or lifecycle fields changed (aliases, priority,
    idle_ttl...), applied in place without touching the backend.
    """

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    reloaded: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    server_changed: bool = False
    routes_changed: bool = False
    """The ``routes:`` section changed (applied at once: routes hold no backend)."""

    @property
    def changed(self) -> bool:
        return bool(
            self.added or self.removed or self.reloaded or self.updated or self.routes_changed
        )
