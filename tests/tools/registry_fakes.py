"""Fakes for registry tests: a backend whose load, failure and crash are scripted per model,
and a factory that records every backend it built.

``FakeFactory.plan(name)`` returns the mutable ``Plan`` for a model: ``load_seconds``,
``fail_starts`` (how many next starts raise), ``memory_bytes`` reported by ``info()``.
All state is owned by the test's event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from backends.base import (
    AdapterSpec,
    BackendCrashed,
    BackendEvent,
    Finished,
    GenerationRequest,
    ModelInfo,
    Started,
    TextDelta,
    Usage,
)
from config.schema import AppConfig

_PIDS = itertools.count(40000)


@dataclass
class Plan:
    load_seconds: float = 0.0
    fail_starts: int = 0
    memory_bytes: int | None = None
    starts: int = 0


class ScriptedBackend:
    def __init__(self, config: Any, on_crash: Callable[[str], None], plan: Plan) -> None:
        self.config = config
        self.on_crash = on_crash
        self.plan = plan
        self.pid = next(_PIDS)
        self.started = False
        self.stopped = False
        self.stopped_at: float | None = None
        self._dead = asyncio.Event()
        self.adapters: dict[str, AdapterSpec] = {}  # registered at run time

    async def start(self) -> None:
        self.plan.starts += 1
        await asyncio.sleep(self.plan.load_seconds)
        if self.plan.fail_starts > 0:
            self.plan.fail_starts -= 1
            raise RuntimeError(f"weights of {self.config.name} are corrupt")
        self.started = True

    async def stop(self) -> None:
        self.stopped = True
        self.stopped_at = time.monotonic()
        self._dead.set()

    async def ready(self) -> bool:
        return self.started and not self.stopped

    def info(self) -> ModelInfo:
        return ModelInfo(
            max_context=1024,
            memory_bytes=self.plan.memory_bytes,
            owned_by="tests",
            extra={"pid": str(self.pid)},
        )

    async def add_adapter(self, adapter: AdapterSpec) -> None:
        self.adapters[adapter.name] = adapter

    async def remove_adapter(self, name: str) -> None:
        del self.adapters[name]

    def crash(self, reason: str = "worker killed by SIGKILL") -> None:
        self._dead.set()
        self.on_crash(reason)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        if self._dead.is_set():
            raise BackendCrashed("backend is gone")
        now = time.time()
        yield Started(queued_at=now, started_at=now)
        yield TextDelta(index=0, text=self.config.name)
        yield Finished(index=0, reason="stop")
        yield Usage(prompt_tokens=1, completion_tokens=1)


@dataclass
class FakeFactory:
    plans: dict[str, Plan] = field(default_factory=dict)
    built: dict[str, list[ScriptedBackend]] = field(default_factory=dict)

    def plan(self, name: str) -> Plan:
        return self.plans.setdefault(name, Plan())

    def __call__(self, config: Any, on_crash: Callable[[str], None]) -> ScriptedBackend:
        backend = ScriptedBackend(config, on_crash, self.plan(config.name))
        self.built.setdefault(config.name, []).append(backend)
        return backend

    def last(self, name: str) -> ScriptedBackend:
        return self.built[name][-1]


def fake_model(name: str, **fields: Any) -> dict[str, Any]:
    """A model entry for the schema; the openai backend needs no local files."""
    return {
        "name": name,
        "backend": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "preload": False,
        **fields,
    }


def app_config(*models: dict[str, Any], budget: int | None = None) -> AppConfig:
    return AppConfig.model_validate(
        {"models": list(models), "registry": {"memory_budget_bytes": budget}}
    )


async def wait_until(predicate: Callable[[], bool], within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
