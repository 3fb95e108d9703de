"""prometheus_client's ``Counter``, ``Gauge`` and ``Histogram`` with cheaper updates.

The library's ``observe`` checks that the metric is observable and then walks the bucket
bounds in a Python loop; on the gateway's hot path (nine observations per streamed
request) that walk was most of the cost of a histogram. Here the bucket is found by
bisection, and counter and gauge updates skip the observability check on a child (it
holds a value, so it is observable; a labelled parent has none and takes the library's
path, which raises). Same values, same exposition, same locking (the library's
per-value mutex, so engine threads may update too). Exemplars, NaN and the multiprocess
``mostrecent`` gauges take the library's own path.
"""

from __future__ import annotations

import math
from bisect import bisect_left

import prometheus_client


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
