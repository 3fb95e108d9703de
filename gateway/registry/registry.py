"""The model registry: which models exist, their lifecycle, admission and routing.

Owned by the event loop: every method runs on it, and so does every task it spawns, so
state changes between two ``await`` points are atomic. Backends report crashes through
the ``on_crash`` callback, which the backend calls on the loop too.

Lifecycle per model (see ``ModelState``): a lease on an unloaded model starts one load
(single-flight: concurrent callers join it); a load first makes room under the memory
budget by draining least recently used idle models, and never cuts off a request in
flight. A failed load or a crash marks the model ``failed`` with an exponential backoff;
crashed models (and failed preloaded ones) restart on their own when it expires.

This module holds the public surface (routing with traffic splits, mirrors, leases,
admin, hot reload, the idle sweeper); ``lifecycle.Lifecycle`` holds the machinery that
moves models between states.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace

from backends.base import AdapterHost, AdapterSpec
from backends.errors import InvalidRequest, ModelNotFound, NotReady, Overloaded
from backends.factory import MemoryEstimate, memory_estimate
from config.routes import MirrorConfig
from config.schema import AppConfig
from gateway.registry import routing
from gateway.registry.adapters import with_adapter, without_adapter
from gateway.registry.diff import diff_configs
from gateway.registry.entry import Backoff, Entry, Instance
from gateway.registry.inplace import replica_status
from gateway.registry.lifecycle import BackendFactory, Lifecycle
from gateway.registry.model_metrics import RegistryMetrics
from gateway.registry.split import SplitKey, Splits
from gateway.registry.tasks import being_cancelled, join
from gateway.registry.values import (
    SERVING_STATES,
    ConfigDiff,
    Lease,
    ModelState,
    ModelStatus,
    RouteDecision,
)

log = logging.getLogger(__name__)

# Suggested client wait while a model is still loading or unloading.
_BUSY_RETRY_AFTER = 2.0


class ModelRegistry:
    """All configured models and their backends. Owned by the event loop (see module doc).

    ``backoff`` spaces retries after failures; ``sweep_interval`` is how often idle TTLs
    are checked (default: a quarter of the shortest TTL, at most 1 s); ``stop_timeout``
    bounds one ``backend.stop()``; ``drain_timeout`` bounds the drain in ``stop()``.
    """

    def __init__(
        self,
        config: AppConfig,
        metrics: RegistryMetrics,
        backend_factory: BackendFactory,
        *,
        backoff: Backoff | None = None,
        sweep_interval: float | None = None,
        stop_timeout: float = 30.0,
        drain_timeout: float = 30.0,
        memory_estimate: MemoryEstimate = memory_estimate,
    ) -> None:
        self._metrics = metrics
        self._life = Lifecycle(
            config,
            metrics,
            backend_factory,
            backoff or Backoff(),
            stop_timeout,
            estimate=memory_estimate,
        )
        self._sweep_interval = sweep_interval
        self._drain_timeout = drain_timeout
        self._index = routing.build_index(config.models)
        self._adapters = routing.build_adapter_index(config.models)
        self.splits = Splits(config.routes, self._resolve)
        """The split routes (read by the front door and ``/v1/models``)."""
        self._adapter_changes = asyncio.Lock()  # one run-time adapter change at a time
        # Adapters registered at run time, per base model (kept across hot reloads).
        self._added: dict[str, dict[str, AdapterSpec]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def config(self) -> AppConfig:
        return self._life.config

    async def start(self, *, wait: bool = True) -> None:
        """Estimate memory, start the idle-TTL sweeper and load every ``preload`` model
        concurrently. With ``wait`` (default) return once each preload succeeded or
        failed; a failed preload does not raise (it retries with backoff)."""
        await self._life.estimate_all()
        self._warn_if_preloads_exceed_budget()
        loads = self._life.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="registry-ttl-sweeper")
        if wait and loads:
            await asyncio.wait(loads)

    async def stop(self) -> None:
        """Refuse new work, let in-flight leases finish (up to ``drain_timeout``), then
        stop every backend (a stream still open after that ends with ``BackendCrashed``)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self._life.stop_all(self._drain_timeout)
        if self._sweeper is not None:
            await asyncio.gather(self._sweeper, return_exceptions=True)
        log.info("registry stopped")

    def is_ready(self) -> bool:
        """Every preloaded model has loaded at least once and none is failed now (a model
        unloaded for idleness or by an operator loads again on demand)."""
        return self._life.started and all(
            entry.ever_loaded and entry.state is not ModelState.FAILED
            for entry in self._life.entries()
            if entry.config.preload
        )

    def route(
        self,
        requested: str,
        key: SplitKey | None = None,
        may_use: Callable[[str], bool] | None = None,
    ) -> RouteDecision:
        """Candidates for a requested model name, alias, adapter, ``capability:<name>`` or
        split route. A route picks one of its targets that ``may_use`` (the client key's
        allow-list) lets through, by ``key`` (``None``: a fresh draw); the decision is that
        target's, with reason ``split``. Count the split with ``record_split`` once the
        request is really sent there."""
        models = {entry.name: entry.config for entry in self._life.entries()}
        split = self.splits.get(requested)
        try:
            target = None if split is None else self.splits.choose(split, key, may_use)
            decision = routing.route(
                target or requested, models, self._index, self._state_of, self._adapters
            )
        except ModelNotFound:
            self._metrics.decided("not_found")
            log.info("route %r: no such model or capability", requested)
            raise
        if target is not None:
            decision = replace(decision, reason="split", route=requested, target=target)
        self._metrics.decided(decision.reason)
        if log.isEnabledFor(logging.DEBUG):  # once per request: no join when it is off
            log.debug(
                "route %r -> %s (%s)", requested, ", ".join(decision.candidates), decision.reason
            )
        return decision

    def _resolve(self, name: str) -> str:
        """The model (or adapter) a configured name stands for."""
        adapter = self._adapters.get(name)
        return adapter[1] if adapter is not None else self._index.get(name, name)

    def record_split(self, decision: RouteDecision) -> None:
        """Count a request a split route sent to its target (once per request)."""
        if decision.route is not None and decision.target is not None:
            self._metrics.split(decision.route, decision.target)

    def mirror_of(self, name: str) -> tuple[str, MirrorConfig] | None:
        """Model ``name``'s mirror as configured now, with its shadow's model name; ``None``
        without one (or when the shadow left in a reload)."""
        entry = self._life.entry(name)
        mirror = entry.config.mirror if entry is not None else None
        if mirror is None or mirror.model not in self._index:
            return None
        return self._index[mirror.model], mirror

    def lease(self, name: str, *, max_wait: float | None = None) -> _Leasing:
        """Hold ``name``'s backend for one request (``async with``); loads it first if
        needed.

        Waits for a load up to ``max_wait`` seconds (default: the model's ``load_timeout``).
        Raises ``ModelNotFound``, ``NotReady`` (loading too long, draining,
        failed, no memory) or ``Overloaded`` (``max_concurrency`` reached, unless the
        backend waits for its slots itself: ``waits_for_slots``).
        """
        return _Leasing(self, name, max_wait)

    async def _take(self, name: str, max_wait: float | None) -> tuple[Entry, Instance]:
        entry = self._lookup(name)
        wait = entry.config.load_timeout if max_wait is None else max_wait
        instance = await self._serving_instance(entry, time.monotonic() + wait)
        limit = entry.config.max_concurrency
        # A relay with a queue_timeout waits for its slots itself (in fair-share order).
        if limit is not None and instance.inflight >= limit and not entry.config.waits_for_slots:
            raise Overloaded(
                f"model '{entry.name}' is serving its limit of {limit} requests",
                code="model_overloaded",
            )
        self._acquire(entry, instance)
        return entry, instance

    def list_models(self) -> list[ModelStatus]:
        return [self._status(entry) for entry in self._life.entries()]

    async def load(self, name: str) -> ModelStatus:
        """Load now, ignoring any backoff; raises ``NotReady`` if the load fails."""
        entry = self._lookup(name)
        for _ in range(3):
            if entry.state in SERVING_STATES:
                break
            if entry.state is ModelState.DRAINING and entry.drain_task is not None:
                await join(entry.drain_task)
                continue
            task = entry.load_task if entry.state is ModelState.LOADING else None
            await join(task or self._life.begin_load(entry))
            if entry.state is ModelState.FAILED:
                raise NotReady(
                    f"model '{entry.name}' failed to load: {entry.last_error}",
                    retry_after=max(1.0, entry.retry_in()),
                )
        return self._status(entry)

    async def unload(self, name: str) -> ModelStatus:
        """Drain (wait for in-flight leases), then stop the backend. A loading model
        finishes its load first; a failed one stops retrying."""
        entry = self._lookup(name)
        await self._life.unload_entry(entry, "manual")
        return self._status(entry)

    async def add_adapter(self, base: str, adapter: AdapterSpec) -> ModelStatus:
        """Register a LoRA adapter of ``base`` at run time (loading ``base`` first): the
        backend checks it (``InvalidRequest`` naming ``source``) and routing knows its
        names once this returns. Names stay unique across models, aliases and adapters."""
        async with self._adapter_changes:
            entry = self._lookup(base)
            taken = [n for n in (adapter.name, *adapter.aliases) if n in self._names_in_use()]
            if taken:
                raise InvalidRequest(f"the name {taken[0]!r} is already in use", param="name")
            config = with_adapter(entry.config, adapter)  # refuses backends without adapters
            await self.load(entry.name)
            instance = entry.instance
            if instance is None or not isinstance(instance.backend, AdapterHost):
                raise InvalidRequest(f"model {entry.name!r} serves no LoRA adapters", param="model")
            await instance.backend.add_adapter(adapter)
            entry.config = config
            self._added.setdefault(entry.name, {})[adapter.name] = adapter
            self._reindex_adapters()
            log.info("adapter %s of %s registered (%s)", adapter.name, entry.name, adapter.source)
            return self._status(entry)

    async def remove_adapter(self, base: str, name: str) -> ModelStatus:
        """Unregister adapter ``name`` of ``base``: no new request routes to it at once;
        those in flight finish on it."""
        async with self._adapter_changes:
            entry = self._lookup(base)
            config = without_adapter(entry.config, name)
            entry.config = config
            self._added.get(entry.name, {}).pop(name, None)
            self._reindex_adapters()
            instance = entry.instance
            if instance is not None and isinstance(instance.backend, AdapterHost):
                await instance.backend.remove_adapter(name)
            log.info("adapter %s of %s unregistered", name, entry.name)
            return self._status(entry)

    def adapter_base(self, name: str) -> str:
        """The base model of adapter ``name`` (or alias); ``ModelNotFound`` otherwise."""
        found = self._adapters.get(name)
        if found is None:
            raise ModelNotFound(f"no LoRA adapter is named {name!r}", param="lora_name")
        return found[0]

    def lora_models(self) -> list[str]:
        """The models that take run-time adapters (hf with LoRA on, openai)."""
        return [
            entry.name
            for entry in self._life.entries()
            if getattr(entry.config, "lora", False) or entry.config.backend == "openai"
        ]

    def _names_in_use(self) -> set[str]:
        return {*self._index, *self._adapters, *(route.name for route in self.splits.all())}

    def _keep_added_adapters(self, diff: ConfigDiff) -> None:
        """After a reload, adapters registered at run time stay with the models whose
        backend kept running (unchanged, or changed in place: an openai model's new
        replicas or adapters); a model that restarts or left starts from the file."""
        for name in (*diff.reloaded, *diff.removed):
            self._added.pop(name, None)
        for name, added in self._added.items():
            entry = self._life.entry(name)
            if entry is None:
                continue
            listed = {a.name for a in getattr(entry.config, "adapters", ())}
            for adapter in added.values():
                if adapter.name not in listed:
                    entry.config = with_adapter(entry.config, adapter)

    def _reindex_adapters(self) -> None:
        self._adapters = routing.build_adapter_index(e.config for e in self._life.entries())

    def drain(self, name: str) -> ModelStatus:
        """Start draining a serving model and return at once: new requests are refused,
        in-flight ones finish, then the backend stops. Any other state is left as it is."""
        entry = self._lookup(name)
        if entry.state in SERVING_STATES:
            self._life.start_drain(entry, "manual")
        return self._status(entry)

    async def apply_config(self, new: AppConfig) -> ConfigDiff:
        """Hot reload. Routing switches to ``new`` at once; added preload models start
        loading; removed and changed models drain in the background, so leases taken
        before the reload finish on the backend they started on."""
        diff = diff_configs(self._life.config, new)
        self._index = routing.build_index(new.models)
        self.splits = Splits(new.routes, self._resolve)
        self._life.apply(diff, new)
        self._keep_added_adapters(diff)
        self._reindex_adapters()
        if diff.server_changed:
            log.warning("config reload: the server section changed; it applies on restart")
        log.info(
            "config applied: added=%s removed=%s reloaded=%s updated=%s routes_changed=%s",
            list(diff.added),
            list(diff.removed),
            list(diff.reloaded),
            list(diff.updated),
            diff.routes_changed,
        )
        return diff

    def record_fallback(self, from_model: str, to_model: str, reason: str) -> None:
        self._metrics.decided("fallback")
        log.warning("fallback from %s to %s: %s", from_model, to_model, reason)

    # ------------------------------------------------------------------ admission

    def _lookup(self, name: str) -> Entry:
        canonical = self._index.get(name)
        entry = self._life.entry(canonical) if canonical is not None else None
        if entry is None:
            raise ModelNotFound(f"The model '{name}' does not exist", param="model")
        return entry

    def _state_of(self, name: str) -> ModelState:
        entry = self._life.entry(name)
        assert entry is not None, f"routing named {name}, which is not in the table"
        return entry.state

    async def _serving_instance(self, entry: Entry, deadline: float) -> Instance:
        """The current instance once it serves, starting or joining its load."""
        state = entry.state
        if state in SERVING_STATES and entry.instance is not None:
            return entry.instance
        if self._life.stopping:
            raise NotReady("the gateway is shutting down", retry_after=_BUSY_RETRY_AFTER)
        if state is ModelState.DRAINING:
            raise NotReady(f"model '{entry.name}' is unloading", retry_after=_BUSY_RETRY_AFTER)
        if state is ModelState.FAILED and (entry.restart_task is not None or entry.retry_in()):
            raise NotReady(
                f"model '{entry.name}' is unavailable: {entry.last_error}",
                retry_after=max(1.0, entry.retry_in()),
            )
        task = entry.load_task if state is ModelState.LOADING else None
        task = task or self._life.begin_load(entry)
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise NotReady(
                f"model '{entry.name}' is still loading", retry_after=_BUSY_RETRY_AFTER
            ) from None
        except asyncio.CancelledError:
            if task.cancelled() and not being_cancelled():
                raise NotReady(f"loading '{entry.name}' was cancelled") from None
            raise
        if entry.state in SERVING_STATES and entry.instance is not None and not entry.removed:
            return entry.instance
        if entry.state is ModelState.FAILED:
            raise NotReady(
                f"model '{entry.name}' failed to load: {entry.last_error}",
                retry_after=max(1.0, entry.retry_in()),
            )
        raise NotReady(
            f"model '{entry.name}' is {entry.state.value}", retry_after=_BUSY_RETRY_AFTER
        )

    def _acquire(self, entry: Entry, instance: Instance) -> None:
        instance.inflight += 1
        instance.idle.clear()
        entry.touch()
        self._metrics.inflight_of(instance.name).inc()
        if entry.instance is instance and entry.state is ModelState.READY:
            self._life.set_state(entry, ModelState.ACTIVE)

    def _release(self, entry: Entry, instance: Instance) -> None:
        instance.inflight -= 1
        entry.touch()
        self._metrics.inflight_of(instance.name).dec()
        if instance.inflight == 0:
            instance.idle.set()
            if entry.instance is instance and entry.state is ModelState.ACTIVE:
                self._life.set_state(entry, ModelState.READY)

    # ------------------------------------------------------------------ bookkeeping

    def _warn_if_preloads_exceed_budget(self) -> None:
        budget = self._life.config.registry.memory_budget_bytes
        total = sum(e.estimated_bytes for e in self._life.entries() if e.config.preload)
        if budget is not None and total > budget:
            log.warning(
                "preloaded models need %d bytes, over the %d budget: some will "
                "fail to load until others are evicted",
                total,
                budget,
            )

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_every())
            try:
                self._unload_idle()
            except Exception:  # the sweeper must outlive one bad pass
                log.exception("idle sweep failed")

    def _unload_idle(self) -> None:
        now = time.monotonic()
        for entry in list(self._life.entries()):
            ttl = entry.config.idle_ttl
            idle = now - entry.last_used_mono
            if ttl is not None and entry.state is ModelState.READY and idle >= ttl:
                log.info("model %s: idle for %.1fs (ttl %gs)", entry.name, idle, ttl)
                self._life.start_drain(entry, "idle_ttl")

    def _sweep_every(self) -> float:
        if self._sweep_interval is not None:
            return self._sweep_interval
        ttls = [e.config.idle_ttl for e in self._life.entries() if e.config.idle_ttl]
        return min([1.0, *(ttl / 4 for ttl in ttls)])

    def _status(self, entry: Entry) -> ModelStatus:
        instance = entry.instance
        info = None
        if instance is not None and not instance.crashed:
            try:
                info = instance.backend.info()
            except Exception:  # a dying backend must not break /v1/models
                info = None
        pid_text = info.extra.get("pid") if info is not None else None
        retired_inflight = self._life.retired_inflight(entry.name)
        config = entry.config
        return ModelStatus(
            name=entry.name,
            backend=config.backend,
            state=entry.state,
            aliases=config.aliases,
            adapters=tuple((a.name, a.aliases) for a in getattr(config, "adapters", ())),
            capabilities=config.capabilities,
            priority=config.priority,
            pid=int(pid_text) if pid_text and pid_text.isdigit() else None,
            memory_bytes=config.memory_bytes
            or (instance.reserved_bytes if instance is not None else 0)
            or entry.estimated_bytes,
            inflight=(instance.inflight if instance is not None else 0) + retired_inflight,
            loaded_at=instance.loaded_at if instance is not None else None,
            last_used=entry.last_used,
            last_error=entry.last_error,
            owned_by=info.owned_by if info is not None else "llmso",
            max_context=(info.max_context if info is not None else None) or config.max_context,
            restarts=entry.restarts,
            retry_in=entry.retry_in() if entry.state is ModelState.FAILED else None,
            replicas=replica_status(instance),
        )


class _Leasing:
    """The ``async with`` of one lease. A class, not ``@asynccontextmanager``: one is
    entered per request, and a generator-based context costs several times more."""

    __slots__ = ("_held", "_max_wait", "_name", "_registry")

    def __init__(self, registry: ModelRegistry, name: str, max_wait: float | None) -> None:
        self._registry = registry
        self._name = name
        self._max_wait = max_wait
        self._held: tuple[Entry, Instance] | None = None

    async def __aenter__(self) -> Lease:
        entry, instance = self._held = await self._registry._take(self._name, self._max_wait)
        return Lease(entry.name, instance.config, instance.backend)

    async def __aexit__(self, *exc_info: object) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._registry._release(*held)
