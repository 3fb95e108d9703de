"""The model table and what moves its models between states: loading (single-flight,
memory budget, timeout), backoff and restarts, crashes, drains, retiring, reloads, shutdown.

``Lifecycle`` is the one owner of the table (entries, retired instances, background
tasks); ``ModelRegistry`` reads it and asks it to change. Owned by the event loop: every
method and task runs on it, so state changes between two ``await`` points are atomic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from backends.factory import BackendFactory, MemoryEstimate, memory_estimate
from config.schema import AppConfig, ModelConfig
from gateway.registry.entry import Backoff, Entry, Instance
from gateway.registry.inplace import reconfigure_replicas, update_in_place
from gateway.registry.model_metrics import RegistryMetrics
from gateway.registry.room import make_room, reported_memory, warn_if_over_budget
from gateway.registry.tasks import being_cancelled, describe, join, on_this_loop
from gateway.registry.values import SERVING_STATES, ConfigDiff, ModelState

log = logging.getLogger(__name__)

__all__ = ["BackendFactory", "Lifecycle", "being_cancelled", "join"]


class Lifecycle:
    """Entries (by name, in config order), retired instances still draining, and the
    background tasks that move them between states; the current config (its memory
    budget applies to the next load). All private: read through ``entry``, ``entries``
    and the properties, change through the methods."""

    def __init__(
        self,
        config: AppConfig,
        metrics: RegistryMetrics,
        factory: BackendFactory,
        backoff: Backoff,
        stop_timeout: float,
        *,
        estimate: MemoryEstimate = memory_estimate,
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._factory = factory
        self._estimate = estimate
        self._backoff = backoff
        self._stop_timeout = stop_timeout
        self._entries: dict[str, Entry] = {}
        self._retired: dict[Instance, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self._stopping = False
        for model in config.models:
            self.add(model)

    @property
    def config(self) -> AppConfig:
        return self._config

    @property
    def started(self) -> bool:
        return self._started

    @property
    def stopping(self) -> bool:
        return self._stopping

    def entry(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def entries(self) -> list[Entry]:
        """Every configured model's entry, in config order."""
        return list(self._entries.values())

    def retired_inflight(self, name: str) -> int:
        """Requests still running on ``name``'s retired (replaced or removed) backends."""
        return sum(instance.inflight for instance in self._retired if instance.name == name)

    async def estimate_all(self) -> None:
        """Estimate every model's memory (for the preload budget warning)."""
        entries = self.entries()
        estimates = await asyncio.gather(*(self._estimate(e.config) for e in entries))
        for entry, estimate in zip(entries, estimates, strict=True):
            entry.estimated_bytes = estimate or 0

    def start(self) -> list[asyncio.Task[None]]:
        """Mark the table started and begin loading every ``preload`` model."""
        self._started = True
        return [self.begin_load(e) for e in self._entries.values() if e.config.preload]

    def add(self, config: ModelConfig) -> Entry:
        entry = Entry(config)
        entry.estimated_bytes = config.memory_bytes or 0
        self._entries[config.name] = entry
        self._metrics.set_state(config.name, entry.state)
        self._metrics.inflight.labels(config.name).set(0)
        return entry

    def remove(self, name: str) -> None:
        """Take ``name`` out of the table; its backend drains and stops in the background."""
        entry = self._entries.pop(name)
        entry.removed = True
        self._spawn(self._retire_entry(entry), f"remove:{name}")

    def apply(self, diff: ConfigDiff, config: AppConfig) -> None:
        """Move the table onto ``config``: ``diff`` says what changed (``diff_configs``)."""
        after = {model.name: model for model in config.models}
        self._config = config
        restart = [*diff.reloaded, *update_in_place(self._entries, diff.updated, after)]
        for name in diff.removed:
            self.remove(name)
        for name in restart:
            entry = self._entries[name]
            was_loaded = entry.instance is not None or entry.state is ModelState.LOADING
            entry.config = after[name]
            self._spawn(self._reload_entry(entry, was_loaded), f"reload:{name}")
        for name in diff.added:
            added = self.add(after[name])
            if added.config.preload and self._started:
                self.begin_load(added)
        self._entries = {name: self._entries[name] for name in after}

    async def stop_all(self, drain_timeout: float) -> None:
        """Refuse new work, let in-flight leases finish (up to ``drain_timeout``), then stop
        every backend (a stream still open after that ends with ``BackendCrashed``)."""
        self._stopping = True
        entries = list(self._entries.values())
        loading = [e.load_task for e in entries if e.load_task is not None]
        for entry in entries:
            _cancel_restart(entry)
            if entry.load_task is not None:
                entry.load_task.cancel()
        await asyncio.gather(*loading, return_exceptions=True)
        drains = [self.start_drain(e, "shutdown") for e in entries if e.state in SERVING_STATES]
        drains += [e.drain_task for e in entries if e.drain_task is not None]
        pending = {*drains, *self._retired.values()}
        if pending:
            await asyncio.wait(pending, timeout=drain_timeout)
        leftovers = [e.instance for e in entries if e.instance is not None]
        leftovers += list(self._retired)
        await asyncio.gather(*(self.stop_instance(inst) for inst in leftovers))
        # Whatever still waits for a lease to end has nothing left to stop.
        stragglers = {*pending, *self._tasks}
        for task in stragglers:
            task.cancel()
        await asyncio.gather(*stragglers, return_exceptions=True)

    def begin_load(self, entry: Entry, *, after_crash: bool = False) -> asyncio.Task[None]:
        """Start loading unless a load already runs (single-flight); returns that task."""
        if entry.load_task is not None and not entry.load_task.done():
            return entry.load_task
        _cancel_restart(entry)
        self.set_state(entry, ModelState.LOADING)
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

        def crashed(reason: str) -> None:
            if instance is not None:
                self.on_crash(entry, instance, reason)

        on_crash = on_this_loop(crashed)

        deadline = asyncio.timeout(config.load_timeout)
        log.info("model %s: loading (%s backend)", entry.name, config.backend)
        try:
            async with deadline:
                needed = await self._memory_needed(entry, config)
                await make_room(self, entry, needed)
                instance = Instance(entry.name, config, self._factory(config, on_crash), needed)
                entry.instance = instance
                await instance.backend.start()
                if instance.crashed:
                    raise RuntimeError(f"crashed while starting: {instance.crash_reason}")
        except asyncio.CancelledError:
            await self._discard(entry, instance)
            self.set_state(entry, ModelState.UNLOADED)
            raise
        except Exception as exc:
            timed_out = isinstance(exc, TimeoutError) and deadline.expired()
            reason = (
                f"load timed out after {config.load_timeout:g}s" if timed_out else describe(exc)
            )
            await self._discard(entry, instance)
            self._metrics.loads.labels(entry.name, "timeout" if timed_out else "failure").inc()
            restart = after_crash or config.preload
            self._fail(entry, reason, restart=restart, after_crash=after_crash)
            return
        self._loaded(entry, instance, time.monotonic() - begun)

    def _loaded(self, entry: Entry, instance: Instance, seconds: float) -> None:
        entry.loaded(instance, reported_memory(instance.backend))
        if not reconfigure_replicas(entry):  # a reload changed the replicas while it loaded
            self._spawn(self._reload_entry(entry, was_loaded=True), f"reload:{entry.name}")
        self._metrics.loads.labels(entry.name, "success").inc()
        self._metrics.load_seconds.labels(entry.name).observe(seconds)
        self.set_state(entry, ModelState.READY)
        log.info(
            "model %s: ready in %.2fs (%d bytes counted)",
            entry.name,
            seconds,
            instance.reserved_bytes,
        )
        warn_if_over_budget(self, entry.name)

    def _fail(self, entry: Entry, reason: str, *, restart: bool, after_crash: bool) -> None:
        delay = entry.failed(reason, self._backoff)
        self.set_state(entry, ModelState.FAILED)
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
        self.begin_load(entry, after_crash=after_crash)

    def on_crash(self, entry: Entry, instance: Instance, reason: str) -> None:
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
        self.retire(instance, wait_idle=False, reason=None)
        self._fail(entry, f"backend crashed: {reason}", restart=True, after_crash=True)

    async def _discard(self, entry: Entry, instance: Instance | None) -> None:
        if instance is None:
            return
        if entry.instance is instance:
            entry.instance = None
        await self.stop_instance(instance)

    async def _memory_needed(self, entry: Entry, config: ModelConfig) -> int:
        if config.memory_bytes is not None:
            return config.memory_bytes
        estimate = await self._estimate(config)
        if estimate is not None:  # else keep what the backend reported when last loaded
            entry.estimated_bytes = estimate
        return entry.estimated_bytes

    def used_bytes(self) -> int:
        current = sum(e.instance.reserved_bytes for e in self._entries.values() if e.instance)
        return current + sum(inst.reserved_bytes for inst in self._retired)

    def pending_drains(self) -> list[asyncio.Task[None]]:
        """Drains and retirements still under way (each frees memory when done)."""
        tasks = [*(e.drain_task for e in self._entries.values()), *self._retired.values()]
        return [task for task in tasks if task is not None and not task.done()]

    def start_drain(self, entry: Entry, reason: str) -> asyncio.Task[None]:
        """Refuse new leases, wait for in-flight ones, stop the backend (single-flight)."""
        if entry.drain_task is not None and not entry.drain_task.done():
            return entry.drain_task
        instance = entry.instance
        assert instance is not None, "only a serving model drains"
        self.set_state(entry, ModelState.DRAINING)
        task = asyncio.create_task(self._drain(entry, instance, reason), name=f"drain:{entry.name}")
        entry.drain_task = task
        return task

    async def _drain(self, entry: Entry, instance: Instance, reason: str) -> None:
        log.info("model %s: draining (%s), %d in flight", entry.name, reason, instance.inflight)
        try:
            await instance.idle.wait()
            await self.stop_instance(instance)
        finally:
            if entry.instance is instance:
                entry.instance = None
            if entry.state is ModelState.DRAINING:
                self.set_state(entry, ModelState.UNLOADED)
        if not entry.removed:
            self._metrics.evictions.labels(entry.name, reason).inc()
        log.info("model %s: unloaded (%s)", entry.name, reason)

    async def unload_entry(self, entry: Entry, reason: str) -> None:
        await self._settle(entry)
        _cancel_restart(entry)  # the load it waited for may have failed and scheduled one
        if entry.state in SERVING_STATES:
            await join(self.start_drain(entry, reason))
        if entry.state is ModelState.FAILED:
            self.set_state(entry, ModelState.UNLOADED)

    def retire(self, instance: Instance, *, wait_idle: bool, reason: str | None) -> None:
        """Detach an instance from its entry; it keeps counting memory until stopped."""
        task = asyncio.create_task(
            self._stop_retired(instance, wait_idle, reason), name=f"retire:{instance.name}"
        )
        self._retired[instance] = task

    async def _stop_retired(self, instance: Instance, wait_idle: bool, reason: str | None) -> None:
        if wait_idle:
            await instance.idle.wait()
        await self.stop_instance(instance)
        if reason is not None:
            self._metrics.evictions.labels(instance.name, reason).inc()
            log.info("model %s: old backend stopped (%s)", instance.name, reason)

    async def stop_instance(self, instance: Instance) -> None:
        if instance.stopped:
            return
        instance.stopped = True
        try:
            async with asyncio.timeout(self._stop_timeout):
                await instance.backend.stop()
        except Exception as exc:
            log.warning("model %s: stopping the backend failed: %s", instance.name, describe(exc))
        finally:
            instance.reserved_bytes = 0
            self._retired.pop(instance, None)

    async def _reload_entry(self, entry: Entry, was_loaded: bool) -> None:
        """Move a changed model onto ``entry.config``: the old instance retires (its
        leases finish on it) and, if it was loaded or preloads, a new one loads."""
        await self._settle(entry)
        instance = entry.instance
        if instance is not None:
            if instance.config is entry.config:
                return  # an earlier reload (or a lease) already loaded this config
            entry.instance = None
            self.retire(instance, wait_idle=True, reason="config_changed")
        if entry.state is ModelState.LOADING:
            return  # a lease started loading the new config meanwhile
        self.set_state(entry, ModelState.UNLOADED)
        entry.failures = 0
        entry.retry_at = 0.0
        if (was_loaded or entry.config.preload) and self._started and not self._stopping:
            self.begin_load(entry)

    async def _retire_entry(self, entry: Entry) -> None:
        await self._settle(entry)
        if entry.instance is not None:
            self.retire(entry.instance, wait_idle=True, reason="config_removed")
            entry.instance = None
        entry.state = ModelState.UNLOADED
        self._metrics.forget(entry.name)

    async def _settle(self, entry: Entry) -> None:
        """Wait for a load or drain in progress, and stop pending restarts."""
        _cancel_restart(entry)
        for task in (entry.load_task, entry.drain_task):
            if task is not None and not task.done():
                await join(task)

    def set_state(self, entry: Entry, state: ModelState) -> None:
        if entry.state is state:
            return
        if log.isEnabledFor(logging.DEBUG):  # twice per request on an idle model
            log.debug("model %s: %s -> %s", entry.name, entry.state.value, state.value)
        entry.state = state
        if not entry.removed:
            self._metrics.set_state(entry.name, state)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _cancel_restart(entry: Entry) -> None:
    if entry.restart_task is not None:
        entry.restart_task.cancel()
        entry.restart_task = None
