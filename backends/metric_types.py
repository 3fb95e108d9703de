"""prometheus_client's ``Counter``, ``Gauge`` and ``Histogram`` with cheaper updates.

The library's ``observe`` checks that the metric is observable and then walks the bucket
bounds in a Python loop; on the gateway's hot path (nine observations per streamed
request) that walk was most of the cost of a histogram. Here the bucket is found by
bisection, and counter and gauge updates skip the observability check on a child (it
holds a value, so it is observable; a labelled parent has none and takes the library's
path, which raises). Same values, same exposition, same locking (the library's
per-value mutex, so engine threads may update too). Exemplars, NaN and the multiprocess
``mostrecent`` gauges take the library's own path.

``LoopCounter``, ``LoopGauge`` and ``LoopHistogram`` also drop that mutex, and add to
their float in place: for families whose every update runs on one thread, the gateway's
event loop (a request's record, routing, the relay). A scrape may read them from any
thread: each value is one float attribute, read whole. In the library's multiprocess mode
they are the plain kinds.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left

import prometheus_client
from prometheus_client import values


class Histogram(prometheus_client.Histogram):
    """A drop-in ``prometheus_client.Histogram``; see the module docstring."""

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is not None or math.isnan(amount):  # NaN counts in no bucket
            super().observe(amount, exemplar)
            return
        try:
            buckets = self._buckets
        except AttributeError:  # a parent with labels: the library raises its own error
            super().observe(amount, exemplar)
            return
        self._sum.inc(amount)
        # Bounds are sorted and end with +Inf: the first bound >= amount is its bucket.
        buckets[bisect_left(self._upper_bounds, amount)].inc(1)


class Counter(prometheus_client.Counter):
    """A drop-in ``prometheus_client.Counter``; see the module docstring."""

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        value = getattr(self, "_value", None)
        if value is None or exemplar is not None or amount < 0:
            super().inc(amount, exemplar)
            return
        value.inc(amount)


class Gauge(prometheus_client.Gauge):
    """A drop-in ``prometheus_client.Gauge``; see the module docstring."""

    def inc(self, amount: float = 1) -> None:
        value = getattr(self, "_value", None)
        if value is None or self._is_most_recent:
            super().inc(amount)
            return
        value.inc(amount)

    def dec(self, amount: float = 1) -> None:
        value = getattr(self, "_value", None)
        if value is None or self._is_most_recent:
            super().dec(amount)
            return
        value.inc(-amount)

    def set(self, value: float) -> None:
        held = getattr(self, "_value", None)
        if held is None or self._is_most_recent:
            super().set(value)
            return
        held.set(float(value))


class _LoopValue:
    """One sample's value, owned by the event loop that updates it (no lock)."""

    __slots__ = ("_exemplar", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._exemplar: object = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: object) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> object:
        return self._exemplar


def _single_process() -> bool:
    return values.ValueClass is values.MutexValue


class LoopCounter(Counter):
    """A ``Counter`` updated only on the event loop; see the module docstring."""

    _own: _LoopValue | None = None  # the child's value, when it is a loop value

    def _metric_init(self) -> None:
        if not _single_process():
            super()._metric_init()
            return
        self._value = self._own = _LoopValue()  # type: ignore[assignment]
        self._created = time.time()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        own = self._own
        if own is None or exemplar is not None or amount < 0:
            super().inc(amount, exemplar)
            return
        own._value += amount  # the float itself: no call per update


class LoopGauge(Gauge):
    """A ``Gauge`` updated only on the event loop; see the module docstring."""

    _own: _LoopValue | None = None

    def _metric_init(self) -> None:
        if not _single_process():
            super()._metric_init()
            return
        self._value = self._own = _LoopValue()  # type: ignore[assignment]

    def inc(self, amount: float = 1) -> None:
        own = self._own
        if own is None:
            super().inc(amount)
            return
        own._value += amount

    def dec(self, amount: float = 1) -> None:
        own = self._own
        if own is None:
            super().dec(amount)
            return
        own._value -= amount

    def set(self, value: float) -> None:
        own = self._own
        if own is None:
            super().set(value)
            return
        own._value = float(value)


class LoopHistogram(Histogram):
    """A ``Histogram`` observed only on the event loop; see the module docstring."""

    _own: _LoopValue | None = None  # the child's sum, when its values are loop values

    def _metric_init(self) -> None:
        if not _single_process():
            super()._metric_init()
            return
        self._buckets = [_LoopValue() for _ in self._upper_bounds]  # type: ignore[misc]
        self._created = time.time()
        self._sum = self._own = _LoopValue()  # type: ignore[assignment]

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        own = self._own
        if own is None or exemplar is not None or math.isnan(amount):
            super().observe(amount, exemplar)
            return
        own._value += amount
        bucket: _LoopValue = self._buckets[bisect_left(self._upper_bounds, amount)]  # type: ignore[assignment]
        bucket._value += 1
