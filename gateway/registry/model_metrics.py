"""Registry Prometheus families on the app's own ``CollectorRegistry``.

Labels stay bounded: model names come from the config, states, results and reasons
from fixed sets in this package.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry

from backends.metric_types import LoopCounter, LoopGauge, LoopHistogram
from gateway.registry.values import ModelState

# Loads range from a proxy health check (milliseconds) to large weights (minutes).
LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class RegistryMetrics:
    """Families for model lifecycle and routing. Created once per app; its caches of
    labelled children are used on the event loop only."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._states: dict[str, dict[ModelState, Any]] = {}
        self._current: dict[str, ModelState] = {}
        self._decisions: dict[str, Any] = {}
        self._inflight: dict[str, Any] = {}
        self._splits: dict[tuple[str, str], Any] = {}
        self.model_state = LoopGauge(
            "llmso_model_state",
            "1 for the model's current lifecycle state, 0 for others.",
            ("model", "state"),
            registry=registry,
        )
        self.load_seconds = LoopHistogram(
            "llmso_model_load_seconds",
            "Time to start a model's backend (successful loads).",
            ("model",),
            buckets=LOAD_BUCKETS,
            registry=registry,
        )
        self.loads = LoopCounter(
            "llmso_model_loads_total",
            "Model load attempts by result.",
            ("model", "result"),
            registry=registry,
        )
        self.evictions = LoopCounter(
            "llmso_model_evictions_total",
            "Models unloaded, by reason.",
            ("model", "reason"),
            registry=registry,
        )
        self.route_decisions = LoopCounter(
            "llmso_route_decisions_total",
            "Routing decisions by reason (and fallbacks).",
            ("reason",),
            registry=registry,
        )
        self.route_requests = LoopCounter(
            "llmso_route_requests_total",
            "Requests a split route sent to each of its targets.",
            ("route", "target"),
            registry=registry,
        )
        self.worker_restarts = LoopCounter(
            "llmso_worker_restarts_total",
            "Automatic restarts after a backend crash.",
            ("model",),
            registry=registry,
        )
        self.inflight = LoopGauge(
            "llmso_model_inflight",
            "Leases (requests) in flight per model.",
            ("model",),
            registry=registry,
        )

    def set_state(self, model: str, state: ModelState) -> None:
        # Every request of an idle model flips it READY -> ACTIVE -> READY: the children
        # are looked up once per model, not with labels() per state per flip.
        # After the first call only the two series that change are written.
        children = self._states.get(model)
        if children is None:
            children = self._states[model] = {
                each: self.model_state.labels(model, each.value) for each in ModelState
            }
            for each, child in children.items():
                child.set(1 if each is state else 0)
        else:
            previous = self._current.get(model)
            if previous is state:
                return
            if previous is not None:
                children[previous].set(0)
            children[state].set(1)
        self._current[model] = state

    def inflight_of(self, model: str) -> Any:
        """The ``inflight`` child of ``model`` (cached)."""
        child = self._inflight.get(model)
        if child is None:
            child = self._inflight[model] = self.inflight.labels(model)
        return child

    def decided(self, reason: str) -> None:
        """Count one routing decision (children cached: reasons are a fixed set)."""
        child = self._decisions.get(reason)
        if child is None:
            child = self._decisions[reason] = self.route_decisions.labels(reason)
        child.inc()

    def split(self, route: str, target: str) -> None:
        """Count one request of split ``route`` sent to ``target`` (both config names)."""
        child = self._splits.get((route, target))
        if child is None:
            child = self._splits[route, target] = self.route_requests.labels(route, target)
        child.inc()

    def forget(self, model: str) -> None:
        """Drop a removed model's per-state series so it stops being reported."""
        self._states.pop(model, None)
        self._current.pop(model, None)
        for each in ModelState:
            with contextlib.suppress(KeyError):
                self.model_state.remove(model, each.value)
