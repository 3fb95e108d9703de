"""Mutable per-model bookkeeping. Owned by the event loop: only ``Lifecycle`` (the table's
owner) and ``ModelRegistry`` (leases) change these objects, on that loop."""

from __future__ import annotations

import asyncio
import time

from backends.backoff import Backoff
from backends.base import Backend
from config.schema import ModelConfig
from gateway.registry.values import ModelState

__all__ = ["Backoff", "Entry", "Instance"]


class Instance:
    """One backend started from one config. Leases count here, so a lease taken before a
    hot reload finishes on the backend it started on. ``reserved_bytes`` is what this
    instance counts against the memory budget until it stops."""

    def __init__(self, name: str, config: ModelConfig, backend: Backend, reserved: int) -> None:
        self.name = name
        self.config = config
        self.backend = backend
        self.reserved_bytes = reserved
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.loaded_at: float | None = None
        self.crashed = False
        self.crash_reason = ""
        self.stopped = False


class Entry:
    """One configured model: its current config, state and (maybe) its current instance.

    At most one of ``load_task`` / ``drain_task`` runs at a time; ``restart_task`` waits
    out a backoff before loading again.
    """

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.state = ModelState.UNLOADED
        self.instance: Instance | None = None
        self.load_task: asyncio.Task[None] | None = None
        self.drain_task: asyncio.Task[None] | None = None
        self.restart_task: asyncio.Task[None] | None = None
        self.failures = 0
        self.retry_at = 0.0  # time.monotonic() before which lazy loads are refused
        self.last_error: str | None = None
        self.last_used_mono = 0.0
        self.last_used: float | None = None
        self.estimated_bytes = 0
        self.ever_loaded = False
        self.restarts = 0
        self.removed = False

    @property
    def name(self) -> str:
        return self.config.name

    def touch(self) -> None:
        self.last_used_mono = time.monotonic()
        self.last_used = time.time()

    def retry_in(self) -> float:
        return max(0.0, self.retry_at - time.monotonic())

    def loaded(self, instance: Instance, reported_bytes: int | None) -> None:
        """``instance`` serves now; a backend's own memory report replaces the estimate."""
        if self.config.memory_bytes is None and reported_bytes:
            instance.reserved_bytes = reported_bytes
            self.estimated_bytes = reported_bytes
        instance.loaded_at = time.time()
        self.failures = 0
        self.ever_loaded = True
        self.touch()

    def failed(self, reason: str, backoff: Backoff) -> float:
        """Count a failure; returns the backoff delay before the next attempt."""
        self.failures += 1
        delay = backoff.delay(self.failures)
        self.retry_at = time.monotonic() + delay
        self.last_error = reason
        return delay
