"""Engine-side figures for the console: queue depth, running sequences, KV-cache use,
upstream health, and two means over the stats window: the engine's batch size and the
gateway's own overhead per request (``llmso_overhead_seconds``: time not spent waiting
on the upstream).

They are read from the app's own metric objects in process (``Collector.collect()`` on
one family at a time), never from the ``/metrics`` text. A ``WindowedMean`` keeps a
short, bounded history of one histogram's sum and count, so a mean over the last minute
can be taken as a difference; its ``totals`` (sum and count over the window) add up
across a fleet's workers (``window_means``). Owned by the event loop.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from backends.hop_metrics import BackendMetrics

# At most one histogram snapshot per this many seconds, however often the page polls.
_SNAPSHOT_EVERY = 0.5
_MAX_SNAPSHOTS = 256
# (taken at, {model: histogram sum}, {model: histogram count})
_Snapshot = tuple[float, dict[str, float], dict[str, float]]
# What a model that reported no engine figure shows (not loaded yet, or no such figure).
NO_ENGINE_FIGURES: dict[str, Any] = dict.fromkeys(
    ("queue_depth", "running", "kv_cache_usage", "upstream_up")
)


def _by_model(family: Any, suffix: str = "") -> dict[str, float]:
    """``{model: value}`` for one family's samples named ``<family><suffix>``."""
    values: dict[str, float] = {}
    for metric in family.collect():
        for sample in metric.samples:
            if sample.name == metric.name + suffix and "model" in sample.labels:
                values[sample.labels["model"]] = float(sample.value)
    return values


class WindowedMean:
    """Per model, the sum and count one histogram gained over the last ``window``
    seconds (a shorter span just after start)."""

    def __init__(self, family: Any, window_seconds: float) -> None:
        self._family = family
        self._window = window_seconds
        self._snapshots: deque[_Snapshot] = deque(maxlen=_MAX_SNAPSHOTS)

    def totals(self, now: float | None = None) -> dict[str, tuple[float, float]]:
        """``{model: (sum, count)}`` over the window; ``(0, 0)`` on the first call (there
        is nothing to compare with)."""
        now = time.monotonic() if now is None else now
        sums, counts = _by_model(self._family, "_sum"), _by_model(self._family, "_count")
        base = self._baseline(now)
        if not self._snapshots or now - self._snapshots[-1][0] >= _SNAPSHOT_EVERY:
            self._snapshots.append((now, sums, counts))
        found: dict[str, tuple[float, float]] = {}
        for model, count in counts.items():
            if base is None:
                found[model] = (0.0, 0.0)
                continue
            total = sums.get(model, 0.0) - base[1].get(model, 0.0)
            found[model] = (total, count - base[2].get(model, 0.0))
        return found

    def _baseline(self, now: float) -> _Snapshot | None:
        """The newest snapshot at least a window old, else the oldest one (the window is
        then shorter: the gateway or the console just started)."""
        while len(self._snapshots) > 1 and now - self._snapshots[1][0] >= self._window:
            self._snapshots.popleft()
        return self._snapshots[0] if self._snapshots else None


def window_means(
    totals: Iterable[Mapping[str, Sequence[float]]],
) -> dict[str, float | None]:
    """Per model, the mean over one or more ``WindowedMean.totals`` (a fleet's workers'
    added up); ``None`` when the window holds no observation."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for one in totals:
        for model, (total, count) in one.items():
            sums[model] = sums.get(model, 0.0) + total
            counts[model] = counts.get(model, 0.0) + count
    return {model: sums[model] / n if n > 0 else None for model, n in counts.items()}


class EngineGauges:
    """Reads the worker and upstream families of one app's ``BackendMetrics``."""

    def __init__(self, metrics: BackendMetrics, window_seconds: float) -> None:
        self._metrics = metrics
        self.batch = WindowedMean(metrics.worker_batch_size, window_seconds)
        self.overhead = WindowedMean(metrics.overhead, window_seconds)

    def current(self) -> dict[str, dict[str, Any]]:
        """``{model: {queue_depth, running, kv_cache_usage, upstream_up}}`` for every model
        that reported any of them (hf engines report the first three, proxies the last)."""
        metrics = self._metrics
        columns = {
            "queue_depth": _by_model(metrics.worker_queue_depth),
            "running": _by_model(metrics.worker_running),
            "kv_cache_usage": _by_model(metrics.worker_kv_cache_usage),
            "upstream_up": _by_model(metrics.upstream_up),
        }
        found: dict[str, dict[str, Any]] = {}
        for column, values in columns.items():
            for model, value in values.items():
                row = found.setdefault(model, dict(NO_ENGINE_FIGURES))
                row[column] = int(value) if column != "kv_cache_usage" else value
        return found

    def batch_means(self, now: float | None = None) -> dict[str, float | None]:
        """Mean sequences per engine step over the window, per model: ``None`` when the
        window holds no step, and on the first call."""
        return window_means([self.batch.totals(now)])
