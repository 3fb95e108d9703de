"""One ``/metrics`` for a fleet: every worker's families, merged by the worker asked.

Why an aggregator and not prometheus-client's multiprocess mode: that mode moves every
counter and histogram update into an mmap'd file under a lock (the gateway's
``Loop*`` families fall back to the library's locked values there), on the per-chunk
path of every stream; here updates stay plain float additions in each worker's own
``CollectorRegistry``, and the cost is paid per scrape instead: each worker serialises
its families (``families``), the hub gathers them, the asking worker merges
(``merged_exposition``).

How samples merge, per family type: counters, histograms and summaries add up (a
request is counted by the one worker that served it, so the sum counts it once);
``*_created`` takes the earliest. A gauge's meaning decides: ``SUMMED_GAUGES`` are this
worker's share of a total (requests in flight); ``MIN_GAUGES`` say something is up, and
the fleet's answer is up only if every worker's is; ``MAX_GAUGES`` describe state every
worker sees alike (a model's state, an upstream's queue), so the highest is the answer,
or where the worst worker is the answer (how late its event loop runs).
A gauge in none of them is added up (``tests/unit/test_fleet.py`` keeps every gauge the
gateway defines in one of the three).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

SUMMED_GAUGES = frozenset(
    {
        "llmso_inflight_requests",
        "llmso_model_inflight",
        "llmso_replica_inflight_requests",
        "llmso_worker_queue_depth",
        "llmso_worker_running_requests",
    }
)
MIN_GAUGES = frozenset({"llmso_limit_store_up", "llmso_upstream_up", "llmso_replica_up"})
MAX_GAUGES = frozenset(
    {
        "llmso_event_loop_lag_seconds",
        "llmso_model_state",
        "llmso_replica_queue_depth",
        "llmso_replica_running_requests",
        "llmso_replica_kv_cache_usage_ratio",
        "llmso_worker_kv_cache_usage_ratio",
        "llmso_worker_prefix_cache_hit_ratio",
    }
)
_ADDED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})

Family = list[Any]
"""``[name, type, help, unit, [[sample name, labels, value], ...]]``; a value that is not
finite travels as its text (JSON has no infinity)."""


def families(registry: CollectorRegistry) -> list[Family]:
    """Every family of ``registry`` as JSON-able lists."""
    return [
        [
            metric.name,
            metric.type,
            metric.documentation,
            metric.unit,
            [[s.name, s.labels, _wire(s.value)] for s in metric.samples],
        ]
        for metric in registry.collect()
    ]


def merged_exposition(replies: Sequence[list[Family]]) -> bytes:
    """The Prometheus text of every worker's families merged (see the module docstring),
    plus ``llmso_fleet_workers``: how many workers this scrape holds."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([*merge(replies), _workers_gauge(len(replies))]))
    return generate_latest(registry)


def merge(replies: Sequence[list[Family]]) -> list[Metric]:
    merged: dict[str, tuple[Metric, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for reply in replies:
        for name, kind, help_text, unit, samples in reply:
            if name not in merged:
                merged[name] = (Metric(name, help_text, kind, unit), {})
            metric, values = merged[name]
            for sample_name, labels, raw in samples:
                key = (sample_name, tuple(sorted(labels.items())))
                value = float(raw)
                held = values.get(key)
                values[key] = value if held is None else _combine(metric, sample_name, held, value)
    out = []
    for metric, values in merged.values():
        for (sample_name, labels), value in values.items():
            metric.add_sample(sample_name, dict(labels), value)
        out.append(metric)
    return out


def _combine(metric: Metric, sample: str, held: float, value: float) -> float:
    if sample.endswith("_created"):
        return min(held, value)
    if metric.type in _ADDED_TYPES:
        return held + value
    if metric.type != "gauge":
        return max(held, value)
    if metric.name in MIN_GAUGES:
        return min(held, value)
    if metric.name in MAX_GAUGES:
        return max(held, value)
    return held + value


def _workers_gauge(count: int) -> Metric:
    metric = Metric(
        "llmso_fleet_workers", "Gateway workers whose metrics this scrape holds.", "gauge"
    )
    metric.add_sample("llmso_fleet_workers", {}, float(count))
    return metric


def _wire(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


class _Fixed:
    """A collector that yields the metrics it was given."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self._metrics
