"""The model registry: which models exist, their lifecycle, admission and routing.

Owned by the event loop: every method runs on it, and so does every task it spawns, so
state changes between two ``await`` points are atomic. Backends report crashes through
the ``on_crash`` callback, which the backend calls on the loop too.

Lifecycle per model (see ``ModelState``): a lease on an unloaded model starts one load
(single-flight: concurrent callers join it); a load first makes room under the memory
budget by draining least recently used idle models, and never cuts off a request in
flight. A failed load or a crash marks the model ``failed`` with an exponential backoff;
crashed models (and failed preloaded ones) restart on their own when it expires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from backends.base import Backend
from backends.factory import CrashHandler
from config.schema import AppConfig, HFModelConfig, ModelConfig
from gateway.registry import routing
from gateway.registry.diff import diff_configs
from gateway.registry.entry import Backoff, Entry, Instance
from gateway.registry.errors import ModelNotFound, ModelOverloaded, ModelUnavailable
from gateway.registry.eviction import Resident, busy_victim, fits, idle_victim
from gateway.registry.memory import estimate_memory_bytes
from gateway.registry.metrics import RegistryMetrics
from gateway.registry.state import (
    SERVING_STATES,
    ConfigDiff,
    Lease,
    ModelState,
    ModelStatus,
    RouteDecision,
)

log = logging.getLogger(__name__)

BackendFactory = Callable[[ModelConfig, CrashHandler], Backend]

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
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._factory = backend_factory
        self._backoff = backoff or Backoff()
        self._sweep_interval = sweep_interval
        self._stop_timeout = stop_timeout
        self._drain_timeout = drain_timeout
        self._entries: dict[str, Entry] = {}
        self._index = routing.build_index(config.models)
        self._retired: dict[Instance, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._started = False
        self._stopping = False
        for model in config.models:
            self._add_entry(model)

    # ------------------------------------------------------------------ public API

    @property
    def config(self) -> AppConfig:
        return self._config

    async def start(self, *, wait: bool = True) -> None:
        """Estimate memory, start the idle-TTL sweeper and load every ``preload`` model
        concurrently. With ``wait`` (default) return once each preload succeeded or
        failed; a failed preload does not raise (it retries with backoff)."""
        await asyncio.to_thread(self._estimate_all, list(self._entries.values()))
        self._warn_if_preloads_exceed_budget()
        self._started = True
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="registry-ttl-sweeper")
        loads = [self._begin_load(e) for e in self._entries.values() if e.config.preload]
        if wait and loads:
            await asyncio.wait(loads)

    async def stop(self) -> None:
        """Refuse new work, let in-flight leases finish (up to ``drain_timeout``), then
        stop every backend (a stream still open after that ends with ``BackendCrashed``)."""
        self._stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for entry in self._entries.values():
            if entry.restart_task is not None:
                entry.restart_task.cancel()
            if entry.load_task is not None and not entry.load_task.done():
                entry.load_task.cancel()
        loading = [e.load_task for e in self._entries.values() if e.load_task is not None]
        await asyncio.gather(*loading, return_exceptions=True)
        drains = [
            self._start_drain(entry, "shutdown")
            for entry in self._entries.values()
            if entry.state in SERVING_STATES
        ]
        drains += [e.drain_task for e in self._entries.values() if e.drain_task is not None]
        pending = [*drains, *self._retired.values()]
        if pending:
            await asyncio.wait(set(pending), timeout=self._drain_timeout)
        leftovers = [e.instance for e in self._entries.values() if e.instance is not None]
        leftovers += list(self._retired)
        await asyncio.gather(*(self._stop_instance(inst) for inst in leftovers))
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("registry stopped")

    def is_ready(self) -> bool:
        """Every preloaded model has loaded at least once and none is failed now (a model
        unloaded for idleness or by an operator loads again on demand)."""
        return self._started and all(
            entry.ever_loaded and entry.state is not ModelState.FAILED
            for entry in self._entries.values()
            if entry.config.preload
        )

    def route(self, requested: str) -> RouteDecision:
        """Candidates for a requested model name, alias or ``capability:<name>``."""
        models = {name: entry.config for name, entry in self._entries.items()}
        try:
            decision = routing.route(requested, models, self._index, self._state_of)
        except ModelNotFound:
            self._metrics.route_decisions.labels("not_found").inc()
            log.info("route %r: no such model or capability", requested)
            raise
        self._metrics.route_decisions.labels(decision.reason).inc()
        log.debug("route %r -> %s (%s)", requested, ", ".join(decision.candidates), decision.reason)
        return decision

    @asynccontextmanager
    async def lease(self, name: str, *, max_wait: float | None = None) -> AsyncIterator[Lease]:
        """Hold ``name``'s backend for one request; loads it first if needed.

        Waits for a load up to ``max_wait`` seconds (default: the model's ``load_timeout``).
        Raises ``ModelNotFound``, ``ModelUnavailable`` (loading too long, draining,
        failed, no memory) or ``ModelOverloaded`` (``max_concurrency`` reached).
        """
        entry = self._lookup(name)
        wait = entry.config.load_timeout if max_wait is None else max_wait
        instance = await self._serving_instance(entry, time.monotonic() + wait)
        limit = entry.config.max_concurrency
        if limit is not None and instance.inflight >= limit:
            raise ModelOverloaded(
                f"model '{entry.name}' is serving its limit of {limit} requests",
                retry_after=1.0,
            )
        self._acquire(entry, instance)
        try:
            yield Lease(entry.name, instance.config, instance.backend)
        finally:
            self._release(entry, instance)

    def list_models(self) -> list[ModelStatus]:
        return [self._status(entry) for entry in self._entries.values()]

    async def load(self, name: str) -> ModelStatus:
        """Load now, ignoring any backoff; raises ``ModelUnavailable`` if the load fails."""
        entry = self._lookup(name)
        for _ in range(3):
            if entry.state in SERVING_STATES:
                break
            if entry.state is ModelState.DRAINING and entry.drain_task is not None:
                await _join(entry.drain_task)
                continue
            task = entry.load_task if entry.state is ModelState.LOADING else None
            await _join(task or self._begin_load(entry))
            if entry.state is ModelState.FAILED:
                raise ModelUnavailable(
                    f"model '{entry.name}' failed to load: {entry.last_error}",
                    retry_after=max(1.0, entry.retry_in()),
                )
        return self._status(entry)

    async def unload(self, name: str) -> ModelStatus:
        """Drain (wait for in-flight leases), then stop the backend. A loading model
        finishes its load first; a failed one stops retrying."""
        entry = self._lookup(name)
        await self._unload_entry(entry, "manual")
        return self._status(entry)

    async def apply_config(self, new: AppConfig) -> ConfigDiff:
        """Hot reload. Routing switches to ``new`` at once; added preload models start
        loading; removed and changed models drain in the background, so leases taken
        before the reload finish on the backend they started on."""
        diff = diff_configs(self._config, new)
        after = {model.name: model for model in new.models}
        self._config = new
        self._index = routing.build_index(new.models)
        for name in diff.updated:
            self._entries[name].config = after[name]
        for name in diff.removed:
            entry = self._entries.pop(name)
            entry.removed = True
            self._spawn(self._retire_entry(entry), f"remove:{name}")
        for name in diff.reloaded:
            entry = self._entries[name]
            was_loaded = entry.instance is not None or entry.state is ModelState.LOADING
            entry.config = after[name]
            self._spawn(self._reload_entry(entry, was_loaded), f"reload:{name}")
        for name in diff.added:
            added = self._add_entry(after[name])
            if added.config.preload and self._started:
                self._begin_load(added)
        self._entries = {name: self._entries[name] for name in after}
        if diff.server_changed:
            log.warning("config reload: the server section changed; it applies on restart")
        log.info(
            "config applied: added=%s removed=%s reloaded=%s updated=%s",
            list(diff.added),
            list(diff.removed),
            list(diff.reloaded),
            list(diff.updated),
        )
        return diff

    def record_fallback(self, from_model: str, to_model: str, reason: str) -> None:
        self._metrics.route_decisions.labels("fallback").inc()
        log.warning("fallback from %s to %s: %s", from_model, to_model, reason)

    # ------------------------------------------------------------------ admission

    def _lookup(self, name: str) -> Entry:
        canonical = self._index.get(name)
        entry = self._entries.get(canonical) if canonical is not None else None
        if entry is None:
            raise ModelNotFound(f"The model '{name}' does not exist", param="model")
        return entry

    def _state_of(self, name: str) -> ModelState:
        return self._entries[name].state

    async def _serving_instance(self, entry: Entry, deadline: float) -> Instance:
        """The current instance once it serves, starting or joining its load."""
        state = entry.state
        if state in SERVING_STATES and entry.instance is not None:
            return entry.instance
        if self._stopping:
            raise ModelUnavailable("the gateway is shutting down", retry_after=_BUSY_RETRY_AFTER)
        if state is ModelState.DRAINING:
            raise ModelUnavailable(
                f"model '{entry.name}' is unloading", retry_after=_BUSY_RETRY_AFTER
            )
        if state is ModelState.FAILED and (entry.restart_task is not None or entry.retry_in()):
            raise ModelUnavailable(
                f"model '{entry.name}' is unavailable: {entry.last_error}",
                retry_after=max(1.0, entry.retry_in()),
            )
        task = entry.load_task if state is ModelState.LOADING else None
        task = task or self._begin_load(entry)
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise ModelUnavailable(
                f"model '{entry.name}' is still loading", retry_after=_BUSY_RETRY_AFTER
            ) from None
        except asyncio.CancelledError:
            if task.cancelled() and not _being_cancelled():
                raise ModelUnavailable(f"loading '{entry.name}' was cancelled") from None
            raise
        if entry.state in SERVING_STATES and entry.instance is not None and not entry.removed:
            return entry.instance
        if entry.state is ModelState.FAILED:
            raise ModelUnavailable(
                f"model '{entry.name}' failed to load: {entry.last_error}",
                retry_after=max(1.0, entry.retry_in()),
            )
        raise ModelUnavailable(
            f"model '{entry.name}' is {entry.state.value}", retry_after=_BUSY_RETRY_AFTER
        )

    def _acquire(self, entry: Entry, instance: Instance) -> None:
        instance.inflight += 1
        instance.idle.clear()
        entry.touch()
        self._metrics.inflight.labels(instance.name).inc()
        if entry.instance is instance and entry.state is ModelState.READY:
            self._set_state(entry, ModelState.ACTIVE)

    def _release(self, entry: Entry, instance: Instance) -> None:
        instance.inflight -= 1
        entry.touch()
        self._metrics.inflight.labels(instance.name).dec()
        if instance.inflight == 0:
            instance.idle.set()
            if entry.instance is instance and entry.state is ModelState.ACTIVE:
                self._set_state(entry, ModelState.READY)

    # ------------------------------------------------------------------ loading

    def _begin_load(self, entry: Entry, *, after_crash: bool = False) -> asyncio.Task[None]:
        """Start loading unless a load already runs (single-flight); returns that task."""
        if entry.load_task is not None and not entry.load_task.done():
            return entry.load_task
        if entry.restart_task is not None:
            entry.restart_task.cancel()
            entry.restart_task = None
        self._set_state(entry, ModelState.LOADING)
        task = asyncio.create_task(
            self._load(entry, after_crash=after_crash), name=f"load:{entry.name}"
        )
        entry.load_task = task
        return task

    async def _load(self, entry: Entry, *, after_crash: bool) -> None:
        """Make room, build and start the backend. Never raises except when cancelled:
        the outcome is the entry's state (``ready`` or ``failed`` with ``last_error``)."""
        config = entry.config
        begun = time.monotonic()
        instance: Instance | None = None

        def on_crash(reason: str) -> None:
            if instance is not None:
                self._on_crash(entry, instance, reason)

        deadline = asyncio.timeout(config.load_timeout)
        log.info("model %s: loading (%s backend)", entry.name, config.backend)
        try:
            async with deadline:
                needed = await self._memory_needed(entry, config)
                await self._make_room(entry, needed)
                instance = Instance(entry.name, config, self._factory(config, on_crash), needed)
                entry.instance = instance
                await instance.backend.start()
                if instance.crashed:
                    raise RuntimeError(f"crashed while starting: {instance.crash_reason}")
        except asyncio.CancelledError:
            await self._discard(entry, instance)
            self._set_state(entry, ModelState.UNLOADED)
            raise
        except Exception as exc:
            timed_out = isinstance(exc, TimeoutError) and deadline.expired()
            reason = (
                f"load timed out after {config.load_timeout:g}s" if timed_out else _describe(exc)
            )
            await self._discard(entry, instance)
            self._metrics.loads.labels(entry.name, "timeout" if timed_out else "failure").inc()
            restart = after_crash or config.preload
            self._fail(entry, reason, restart=restart, after_crash=after_crash)
            return
        self._loaded(entry, instance, time.monotonic() - begun)

    def _loaded(self, entry: Entry, instance: Instance, seconds: float) -> None:
        reported = _safe_info_memory(instance.backend)
        if entry.config.memory_bytes is None and reported:
            instance.reserved_bytes = reported
            entry.estimated_bytes = reported
        instance.loaded_at = time.time()
        entry.failures = 0
        entry.ever_loaded = True
        entry.touch()
        self._metrics.loads.labels(entry.name, "success").inc()
        self._metrics.load_seconds.labels(entry.name).observe(seconds)
        self._set_state(entry, ModelState.READY)
        log.info(
            "model %s: ready in %.2fs (%d bytes counted)",
            entry.name,
            seconds,
            instance.reserved_bytes,
        )
        budget = self._config.registry.memory_budget_bytes
        if budget is not None and self._used_bytes() > budget:
            log.warning(
                "memory budget exceeded after loading %s: the model reports "
                "more than estimated; later loads will evict",
                entry.name,
            )

    def _fail(self, entry: Entry, reason: str, *, restart: bool, after_crash: bool) -> None:
        entry.failures += 1
        delay = self._backoff.delay(entry.failures)
        entry.retry_at = time.monotonic() + delay
        entry.last_error = reason
        self._set_state(entry, ModelState.FAILED)
        auto = restart and not self._stopping and not entry.removed
        log.warning(
            "model %s: failed (%s); %s in %.1fs",
            entry.name,
            reason,
            "restarting" if auto else "may retry",
            delay,
        )
        if auto:
            entry.restart_task = asyncio.create_task(
                self._restart_after(entry, delay, after_crash=after_crash),
                name=f"restart:{entry.name}",
            )

    async def _restart_after(self, entry: Entry, delay: float, *, after_crash: bool) -> None:
        await asyncio.sleep(delay)
        entry.restart_task = None
        if entry.removed or self._stopping or entry.state is not ModelState.FAILED:
            return
        if after_crash:
            entry.restarts += 1
            self._metrics.worker_restarts.labels(entry.name).inc()
        log.info(
            "model %s: automatic restart (attempt after %d failure(s))", entry.name, entry.failures
        )
        self._begin_load(entry, after_crash=after_crash)

    def _on_crash(self, entry: Entry, instance: Instance, reason: str) -> None:
        """The backend died on its own. Its in-flight streams already ended with
        ``BackendCrashed``; mark the model failed, free it, restart after a backoff."""
        if instance.crashed:
            return
        instance.crashed = True
        instance.crash_reason = reason
        log.error("model %s: backend crashed: %s", entry.name, reason)
        if entry.instance is not instance or entry.state not in SERVING_STATES:
            return  # a load in progress, a drain or a retired instance handles it
        entry.instance = None
        self._retire(instance, wait_idle=False, reason=None)
        self._fail(entry, f"backend crashed: {reason}", restart=True, after_crash=True)

    async def _discard(self, entry: Entry, instance: Instance | None) -> None:
        if instance is None:
            return
        if entry.instance is instance:
            entry.instance = None
        await self._stop_instance(instance)

    # ------------------------------------------------------------------ memory

    async def _memory_needed(self, entry: Entry, config: ModelConfig) -> int:
        if config.memory_bytes is not None:
            return config.memory_bytes
        if isinstance(config, HFModelConfig):
            entry.estimated_bytes = await asyncio.to_thread(estimate_memory_bytes, config)
        return entry.estimated_bytes

    def _used_bytes(self) -> int:
        current = sum(e.instance.reserved_bytes for e in self._entries.values() if e.instance)
        return current + sum(inst.reserved_bytes for inst in self._retired)

    async def _make_room(self, entry: Entry, needed: int) -> None:
        """Return once ``needed`` bytes fit the budget: drain idle models (LRU first), wait
        for drains under way, then drain busy models. Raises ``ModelUnavailable`` when
        nothing can be freed; the caller's load timeout bounds the waiting."""
        budget = self._config.registry.memory_budget_bytes
        if budget is None or needed == 0:
            return
        if needed > budget:
            raise ModelUnavailable(f"needs {needed} bytes; the memory budget is {budget}")
        while not fits(self._used_bytes(), needed, budget):
            residents = self._residents()
            victim = idle_victim(residents, entry.name)
            if victim is not None:
                log.info("evicting idle %s (least recently used) to load %s", victim, entry.name)
                await _join(self._start_drain(self._entries[victim], "memory"))
                continue
            pending = [
                task
                for task in (
                    *(e.drain_task for e in self._entries.values()),
                    *self._retired.values(),
                )
                if task is not None and not task.done()
            ]
            if pending:
                await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
                continue
            victim = busy_victim(residents, entry.name)
            if victim is not None:
                log.info("draining busy %s (least recently used) to load %s", victim, entry.name)
                self._start_drain(self._entries[victim], "memory")
                continue
            raise ModelUnavailable(
                f"not enough memory: needs {needed} bytes, {self._used_bytes()} of {budget} "
                "held by models that cannot be evicted now"
            )

    def _residents(self) -> list[Resident]:
        return [
            Resident(
                e.name, e.state, e.instance.reserved_bytes, e.instance.inflight, e.last_used_mono
            )
            for e in self._entries.values()
            if e.instance is not None
        ]

    # ------------------------------------------------------------------ unloading

    def _start_drain(self, entry: Entry, reason: str) -> asyncio.Task[None]:
        """Refuse new leases, wait for in-flight ones, stop the backend (single-flight)."""
        if entry.drain_task is not None and not entry.drain_task.done():
            return entry.drain_task
        instance = entry.instance
        assert instance is not None, "only a serving model drains"
        self._set_state(entry, ModelState.DRAINING)
        task = asyncio.create_task(self._drain(entry, instance, reason), name=f"drain:{entry.name}")
        entry.drain_task = task
        return task

    async def _drain(self, entry: Entry, instance: Instance, reason: str) -> None:
        log.info("model %s: draining (%s), %d in flight", entry.name, reason, instance.inflight)
        try:
            await instance.idle.wait()
            await self._stop_instance(instance)
        finally:
            if entry.instance is instance:
                entry.instance = None
            if entry.state is ModelState.DRAINING:
                self._set_state(entry, ModelState.UNLOADED)
        if not entry.removed:
            self._metrics.evictions.labels(entry.name, reason).inc()
        log.info("model %s: unloaded (%s)", entry.name, reason)

    async def _unload_entry(self, entry: Entry, reason: str) -> None:
        if entry.load_task is not None and not entry.load_task.done():
            await _join(entry.load_task)
        if entry.restart_task is not None:
            entry.restart_task.cancel()
            entry.restart_task = None
        if entry.state in SERVING_STATES:
            self._start_drain(entry, reason)
        if entry.drain_task is not None and not entry.drain_task.done():
            await _join(entry.drain_task)
        if entry.state is ModelState.FAILED:
            self._set_state(entry, ModelState.UNLOADED)

    def _retire(self, instance: Instance, *, wait_idle: bool, reason: str | None) -> None:
        """Detach an instance from its entry; it keeps counting memory until stopped."""
        task = asyncio.create_task(
            self._stop_retired(instance, wait_idle, reason), name=f"retire:{instance.name}"
        )
        self._retired[instance] = task

    async def _stop_retired(self, instance: Instance, wait_idle: bool, reason: str | None) -> None:
        if wait_idle:
            await instance.idle.wait()
        await self._stop_instance(instance)
        if reason is not None:
            self._metrics.evictions.labels(instance.name, reason).inc()
            log.info("model %s: old backend stopped (%s)", instance.name, reason)

    async def _stop_instance(self, instance: Instance) -> None:
        if instance.stopped:
            return
        instance.stopped = True
        try:
            async with asyncio.timeout(self._stop_timeout):
                await instance.backend.stop()
        except Exception as exc:
            log.warning("model %s: stopping the backend failed: %s", instance.name, _describe(exc))
        finally:
            instance.reserved_bytes = 0
            self._retired.pop(instance, None)

    # ------------------------------------------------------------------ hot reload

    async def _reload_entry(self, entry: Entry, was_loaded: bool) -> None:
        await self._settle(entry)
        instance = entry.instance
        if instance is not None and instance.config is not entry.config:
            entry.instance = None
            self._retire(instance, wait_idle=True, reason="config_changed")
        if entry.state is not ModelState.LOADING:
            self._set_state(entry, ModelState.UNLOADED)
            entry.failures = 0
            entry.retry_at = 0.0
            if (was_loaded or entry.config.preload) and self._started and not self._stopping:
                self._begin_load(entry)

    async def _retire_entry(self, entry: Entry) -> None:
        await self._settle(entry)
        if entry.instance is not None:
            self._retire(entry.instance, wait_idle=True, reason="config_removed")
            entry.instance = None
        entry.state = ModelState.UNLOADED
        self._metrics.forget(entry.name)

    async def _settle(self, entry: Entry) -> None:
        """Wait for a load or drain in progress, and stop pending restarts."""
        if entry.restart_task is not None:
            entry.restart_task.cancel()
            entry.restart_task = None
        for task in (entry.load_task, entry.drain_task):
            if task is not None and not task.done():
                await _join(task)

    # ------------------------------------------------------------------ bookkeeping

    def _add_entry(self, config: ModelConfig) -> Entry:
        entry = Entry(config)
        entry.estimated_bytes = config.memory_bytes or 0
        self._entries[config.name] = entry
        self._metrics.set_state(config.name, entry.state)
        self._metrics.inflight.labels(config.name).set(0)
        return entry

    def _set_state(self, entry: Entry, state: ModelState) -> None:
        if entry.state is state:
            return
        log.debug("model %s: %s -> %s", entry.name, entry.state.value, state.value)
        entry.state = state
        if not entry.removed:
            self._metrics.set_state(entry.name, state)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _estimate_all(entries: list[Entry]) -> None:
        for entry in entries:
            entry.estimated_bytes = estimate_memory_bytes(entry.config)

    def _warn_if_preloads_exceed_budget(self) -> None:
        budget = self._config.registry.memory_budget_bytes
        total = sum(e.estimated_bytes for e in self._entries.values() if e.config.preload)
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
        for entry in list(self._entries.values()):
            ttl = entry.config.idle_ttl
            idle = now - entry.last_used_mono
            if ttl is not None and entry.state is ModelState.READY and idle >= ttl:
                log.info("model %s: idle for %.1fs (ttl %gs)", entry.name, idle, ttl)
                self._start_drain(entry, "idle_ttl")

    def _sweep_every(self) -> float:
        if self._sweep_interval is not None:
            return self._sweep_interval
        ttls = [e.config.idle_ttl for e in self._entries.values() if e.config.idle_ttl]
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
        retired_inflight = sum(i.inflight for i in self._retired if i.name == entry.name)
        config = entry.config
        return ModelStatus(
            name=entry.name,
            backend=config.backend,
            state=entry.state,
            aliases=config.aliases,
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
        )


async def _join(task: asyncio.Task[None]) -> None:
    """Wait for a shared task without cancelling it when we are cancelled, and without
    turning its cancellation (or failure) into ours."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if _being_cancelled() or not task.cancelled():
            raise
    except Exception as exc:
        log.debug("joined task %s failed: %s", task.get_name(), _describe(exc))


def _being_cancelled() -> bool:
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _safe_info_memory(backend: Backend) -> int | None:
    try:
        return backend.info().memory_bytes
    except Exception:
        return None
