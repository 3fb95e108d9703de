"""Engine-side figures for the console: queue depth, running sequences, KV-cache use,
upstream health and the mean batch size over the stats window.

They are read from the app's own metric objects in process (``Collector.collect()`` on
one family at a time), never from the ``/metrics`` text. ``EngineGauges`` keeps a short,
bounded history of the batch-size histogram's sum and count, so a mean over the last
minute can be taken as a difference; it is owned by the event loop.
"""

from __future__ import annotations

import time
from collections import deque
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


class EngineGauges:
    """Reads the worker and upstream families of one app's ``BackendMetrics``."""

    def __init__(self, metrics: BackendMetrics, window_seconds: float) -> None:
        self._metrics = metrics
        self._window = window_seconds
        self._snapshots: deque[_Snapshot] = deque(maxlen=_MAX_SNAPSHOTS)

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
        window holds no step, and on the first call (there is nothing to compare with)."""
        now = time.monotonic() if now is None else now
        family = self._metrics.worker_batch_size
        sums, counts = _by_model(family, "_sum"), _by_model(family, "_count")
        base = self._baseline(now)
        if not self._snapshots or now - self._snapshots[-1][0] >= _SNAPSHOT_EVERY:
            self._snapshots.append((now, sums, counts))
        means: dict[str, float | None] = {}
        for model, count in counts.items():
            steps = count - base[2].get(model, 0.0) if base is not None else 0.0
            total = sums.get(model, 0.0) - (base[1].get(model, 0.0) if base is not None else 0.0)
            means[model] = total / steps if steps > 0 else None
        return means

    def _baseline(self, now: float) -> _Snapshot | None:
        """The newest snapshot at least a window old, else the oldest one (the window is
        then shorter: the gateway or the console just started)."""
        while len(self._snapshots) > 1 and now - self._snapshots[1][0] >= self._window:
            self._snapshots.popleft()
        return self._snapshots[0] if self._snapshots else None
