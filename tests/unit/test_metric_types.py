"""``backends.metric_types.Histogram`` exposes exactly what prometheus_client's does."""

from __future__ import annotations

import math

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from backends.metric_types import (
    Counter,
    Gauge,
    Histogram,
    LoopCounter,
    LoopGauge,
    LoopHistogram,
)

BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
VALUES = (0, 1e-4, 0.001, 0.0010001, 0.01, 0.5, 1, 1.0, 9.99, 10, 10.01, 1e12, math.inf, -3, 7)


def _exposition(cls: type[prometheus_client.Histogram], values: tuple[float, ...]) -> list[str]:
    registry = CollectorRegistry()
    family = cls("h", "doc", ("model",), buckets=BOUNDS, registry=registry)
    for value in values:
        family.labels("m").observe(value)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


@pytest.mark.parametrize("values", [VALUES, (), (math.nan, 1.0), tuple(BOUNDS)])
def test_same_buckets_sum_and_count_as_the_library(values: tuple[float, ...]) -> None:
    assert _exposition(Histogram, values) == _exposition(prometheus_client.Histogram, values)


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    registry = CollectorRegistry()
    Histogram("h", "doc", buckets=BOUNDS, registry=registry).observe(0.01)
    assert registry.get_sample_value("h_bucket", {"le": "0.001"}) == 0
    assert registry.get_sample_value("h_bucket", {"le": "0.01"}) == 1


def test_the_labelled_parent_still_refuses_observations() -> None:
    family = Histogram("h", "doc", ("model",), registry=CollectorRegistry())
    with pytest.raises(ValueError, match="missing label values"):
        family.observe(1.0)


def _counter_gauge_exposition(counter: type, gauge: type) -> list[str]:
    registry = CollectorRegistry()
    requests = counter("c", "doc", ("model",), registry=registry)
    plain = counter("p", "doc", registry=registry)
    inflight = gauge("g", "doc", ("model",), registry=registry)
    for amount in (1, 2.5, 0):
        requests.labels("m").inc(amount)
        plain.inc(amount)
    inflight.labels("m").inc()
    inflight.labels("m").inc(3)
    inflight.labels("m").dec(1.5)
    inflight.labels("n").set(7)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_counters_and_gauges_expose_what_the_library_does() -> None:
    ours = _counter_gauge_exposition(Counter, Gauge)
    assert ours == _counter_gauge_exposition(prometheus_client.Counter, prometheus_client.Gauge)
    assert 'c_total{model="m"} 3.5' in ours and 'g{model="m"} 2.5' in ours


def test_counter_and_gauge_parents_and_negative_increments_still_refused() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "doc", ("model",), registry=registry)
    gauge = Gauge("g", "doc", ("model",), registry=registry)
    with pytest.raises(ValueError, match="missing label values"):
        counter.inc()
    with pytest.raises(ValueError, match="missing label values"):
        gauge.set(1)
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("m").inc(-1)


@pytest.mark.parametrize("values", [VALUES, (), (math.nan, 1.0)])
def test_loop_kinds_expose_what_the_library_does(values: tuple[float, ...]) -> None:
    assert _exposition(LoopHistogram, values) == _exposition(prometheus_client.Histogram, values)
    ours = _counter_gauge_exposition(LoopCounter, LoopGauge)
    assert ours == _counter_gauge_exposition(prometheus_client.Counter, prometheus_client.Gauge)


def test_loop_kinds_hold_no_lock_and_refuse_like_the_library() -> None:
    registry = CollectorRegistry()
    counter = LoopCounter("c", "doc", ("model",), registry=registry)
    assert not hasattr(counter.labels("m")._value, "_lock")
    with pytest.raises(ValueError, match="missing label values"):
        counter.inc()
    with pytest.raises(ValueError, match="non-negative"):
        counter.labels("m").inc(-1)
