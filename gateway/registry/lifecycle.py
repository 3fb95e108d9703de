"""The per-model lifecycle machinery behind ``ModelRegistry``: loading (single-flight,
memory budget, timeout), failure backoff and restarts, crash handling, draining and
retiring backends.

Owned by the event loop, like the registry that holds it: every method and every task
here runs on that loop, so state changes between two ``await`` points are atomic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from backends.base import Backend
from backends.errors import NotReady
from backends.factory import CrashHandler
from config.schema import AppConfig, HFModelConfig, ModelConfig
from gateway.registry.entry import Backoff, Entry, Instance
from gateway.registry.eviction import Resident, busy_victim, fits, idle_victim
from gateway.registry.memory import estimate_memory_bytes
from gateway.registry.metrics import RegistryMetrics
from gateway.registry.state import SERVING_STATES, ModelState

log = logging.getLogger(__name__)

BackendFactory = Callable[[ModelConfig, CrashHandler], Backend]


class Lifecycle:
    """Entries (by name, in config order), retired instances still draining, and the
    background tasks that move them between states. ``config`` is the current config
    (its memory budget applies to the next load)."""

    def __init__(
        self,
        config: AppConfig,
        metrics: RegistryMetrics,
        factory: BackendFactory,
        backoff: Backoff,
        stop_timeout: float,
    ) -> None:
        self.config = config
        self._metrics = metrics
        self._factory = factory
        self._backoff = backoff
        self._stop_timeout = stop_timeout
        self.entries: dict[str, Entry] = {}
        self.retired: dict[Instance, asyncio.Task[None]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started = False
        self.stopping = False

    def begin_load(self, entry: Entry, *, after_crash: bool = False) -> asyncio.Task[None]:
        """Start loading unless a load already runs (single-flight); returns that task."""
        if entry.load_task is not None and not entry.load_task.done():
            return entry.load_task
        if entry.restart_task is not None:
            entry.restart_task.cancel()
            entry.restart_task = None
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

        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def on_crash(reason: str) -> None:
            # The contract says backends call this on the loop; hop over if one does not.
            if threading.get_ident() != loop_thread:
                loop.call_soon_threadsafe(on_crash, reason)
            elif instance is not None:
                self.on_crash(entry, instance, reason)

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
            self.set_state(entry, ModelState.UNLOADED)
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
        self.set_state(entry, ModelState.READY)
        log.info(
            "model %s: ready in %.2fs (%d bytes counted)",
            entry.name,
            seconds,
            instance.reserved_bytes,
        )
        budget = self.config.registry.memory_budget_bytes
        if budget is not None and self.used_bytes() > budget:
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
        self.set_state(entry, ModelState.FAILED)
        auto = restart and not self.stopping and not entry.removed
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
        if entry.removed or self.stopping or entry.state is not ModelState.FAILED:
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
        if isinstance(config, HFModelConfig):
            entry.estimated_bytes = await asyncio.to_thread(estimate_memory_bytes, config)
        return entry.estimated_bytes

    def used_bytes(self) -> int:
        current = sum(e.instance.reserved_bytes for e in self.entries.values() if e.instance)
        return current + sum(inst.reserved_bytes for inst in self.retired)

    async def _make_room(self, entry: Entry, needed: int) -> None:
        """Return once ``needed`` bytes fit the budget: drain idle models (LRU first), wait
        for drains under way, then drain busy models. Raises ``NotReady`` when
        nothing can be freed; the caller's load timeout bounds the waiting."""
        budget = self.config.registry.memory_budget_bytes
        if budget is None or needed == 0:
            return
        if needed > budget:
            raise NotReady(f"needs {needed} bytes; the memory budget is {budget}")
        while not fits(self.used_bytes(), needed, budget):
            residents = self._residents()
            victim = idle_victim(residents, entry.name)
            if victim is not None:
                log.info("evicting idle %s (least recently used) to load %s", victim, entry.name)
                await join(self.start_drain(self.entries[victim], "memory"))
                continue
            pending = [
                task
                for task in (
                    *(e.drain_task for e in self.entries.values()),
                    *self.retired.values(),
                )
                if task is not None and not task.done()
            ]
            if pending:
                await asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED)
                continue
            victim = busy_victim(residents, entry.name)
            if victim is not None:
                log.info("draining busy %s (least recently used) to load %s", victim, entry.name)
                self.start_drain(self.entries[victim], "memory")
                continue
            raise NotReady(
                f"not enough memory: needs {needed} bytes, {self.used_bytes()} of {budget} "
                "held by models that cannot be evicted now"
            )

    def _residents(self) -> list[Resident]:
        return [
            Resident(
                e.name, e.state, e.instance.reserved_bytes, e.instance.inflight, e.last_used_mono
            )
            for e in self.entries.values()
            if e.instance is not None
        ]

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
        if entry.load_task is not None and not entry.load_task.done():
            await join(entry.load_task)
        if entry.restart_task is not None:
            entry.restart_task.cancel()
            entry.restart_task = None
        if entry.state in SERVING_STATES:
            self.start_drain(entry, reason)
        if entry.drain_task is not None and not entry.drain_task.done():
            await join(entry.drain_task)
        if entry.state is ModelState.FAILED:
            self.set_state(entry, ModelState.UNLOADED)

    def retire(self, instance: Instance, *, wait_idle: bool, reason: str | None) -> None:
        """Detach an instance from its entry; it keeps counting memory until stopped."""
        task = asyncio.create_task(
            self._stop_retired(instance, wait_idle, reason), name=f"retire:{instance.name}"
        )
        self.retired[instance] = task

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
            log.warning("model %s: stopping the backend failed: %s", instance.name, _describe(exc))
        finally:
            instance.reserved_bytes = 0
            self.retired.pop(instance, None)

    async def reload_entry(self, entry: Entry, was_loaded: bool) -> None:
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
        if (was_loaded or entry.config.preload) and self.started and not self.stopping:
            self.begin_load(entry)

    async def retire_entry(self, entry: Entry) -> None:
        await self._settle(entry)
        if entry.instance is not None:
            self.retire(entry.instance, wait_idle=True, reason="config_removed")
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
                await join(task)

    def set_state(self, entry: Entry, state: ModelState) -> None:
        if entry.state is state:
            return
        log.debug("model %s: %s -> %s", entry.name, entry.state.value, state.value)
        entry.state = state
        if not entry.removed:
            self._metrics.set_state(entry.name, state)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def join(task: asyncio.Task[None]) -> None:
    """Wait for a shared task without cancelling it when we are cancelled, and without
    turning its cancellation (or failure) into ours."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if being_cancelled() or not task.cancelled():
            raise
    except Exception as exc:
        log.debug("joined task %s failed: %s", task.get_name(), _describe(exc))


def being_cancelled() -> bool:
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
