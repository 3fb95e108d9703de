"""``Histogram``: prometheus_client's histogram with an ``observe`` that finds its bucket
by bisection.

The library's ``observe`` checks that the metric is observable and then walks the bucket
bounds in a Python loop; on the gateway's hot path (nine observations per streamed
request) that walk was most of the cost of a histogram. Same buckets, same values, same
exposition, same locking (the library's per-value mutex, so engine threads may observe
too); only the search differs. Exemplars and NaN take the library's own path.
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
