"""The rate → latency step: a flow-equivalent server over a measured curve.

One replica is a birth-death chain on ``n``, the requests in it (running plus queued).
Arrivals are Poisson at ``rate``; with ``k = min(n, max_num_seqs)`` running, requests
complete at ``X(k)``, the throughput measured at concurrency ``k`` (closed loop, so by
Little's law ``X(k) = k / mean E2E at k``). The stationary distribution is

    p(n) ∝ Π_{i=1..n} rate / X(min(i, B)),   n = 0 .. B + max_queue

(an M/G/c-like server whose speed depends on its occupancy; for a constant-rate server it
is exactly M/M/1/K). By PASTA an arrival sees ``p``; one that finds ``n`` requests

- is rejected (429) when ``n = B + max_queue``;
- runs at occupancy ``min(n + 1, B)``, its TTFT and E2E drawn from the measured samples
  at that concurrency (quantiles interpolated linearly between measured levels);
- first waits, when ``n ≥ B``, for ``n - B + 1`` departures: ``(n - B + 1) / X(B)``.

The p95s are quantiles of that mixture; the mean E2E is Little's ``L / rate_accepted``.

``B`` is always a measured level: occupancy above it queues, so the model never needs a
curve point that was not measured. Token counts other than the measured ones scale each
sample's decode part, ``E2E' = TTFT + (E2E - TTFT) · out'/out`` (said in the notes).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from bench.plan.inputs import Curve, Level

_GRID = 200  # quantile points per occupancy state


@dataclass(frozen=True, slots=True)
class Scaled:
    """One level's samples rescaled to the profile's output tokens."""

    concurrency: int
    throughput: float  # requests/s, Little's law: concurrency / mean E2E
    ttft: tuple[float, ...]  # sorted
    e2e: tuple[float, ...]  # sorted
    source: str


def scale_level(level: Level, output_tokens: float) -> Scaled:
    factor = output_tokens / level.output_tokens if level.output_tokens else 1.0
    e2e = [t + (e - t) * factor for t, e in zip(level.ttft_s, level.e2e_s, strict=True)]
    return Scaled(
        concurrency=level.concurrency,
        throughput=level.concurrency / (sum(e2e) / len(e2e)),
        ttft=tuple(sorted(level.ttft_s)),
        e2e=tuple(sorted(e2e)),
        source=level.source,
    )


@dataclass(frozen=True, slots=True)
class Prediction:
    rate_rps: float  # offered to this replica
    max_num_seqs: int
    capacity_rps: float  # X(max_num_seqs)
    utilization: float  # rate / capacity
    reject_fraction: float
    mean_in_system: float
    mean_e2e_s: float
    ttft_p95_s: float
    e2e_p95_s: float
    above_measured: float  # share of arrivals that queue because occupancy >= B
    sources: tuple[str, ...]


def _quantile(sorted_values: tuple[float, ...], q: float) -> float:
    rank = (len(sorted_values) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def _interpolated(levels: list[Scaled], k: int) -> tuple[float, list[float], list[float]]:
    """Throughput and TTFT/E2E quantile grids at occupancy ``k`` (within the measured range,
    or below the lowest level, where the lowest level's latency is used)."""
    grid = [(j + 0.5) / _GRID for j in range(_GRID)]
    low = levels[0]
    if k <= low.concurrency:
        throughput = low.throughput * k / low.concurrency  # fewer in flight: same speed each
        return (
            throughput,
            [_quantile(low.ttft, q) for q in grid],
            [_quantile(low.e2e, q) for q in grid],
        )
    for a, b in itertools.pairwise(levels):
        if a.concurrency <= k <= b.concurrency:
            w = (k - a.concurrency) / (b.concurrency - a.concurrency)
            throughput = a.throughput + w * (b.throughput - a.throughput)
            ttft = [
                _quantile(a.ttft, q) + w * (_quantile(b.ttft, q) - _quantile(a.ttft, q))
                for q in grid
            ]
            e2e = [
                _quantile(a.e2e, q) + w * (_quantile(b.e2e, q) - _quantile(a.e2e, q)) for q in grid
            ]
            return throughput, ttft, e2e
    raise ValueError(f"occupancy {k} is above the highest measured level")


def _weighted_quantile(points: list[tuple[float, float]], q: float) -> float:
    points.sort()
    total = sum(w for _, w in points)
    running = 0.0
    for value, weight in points:
        running += weight
        if running >= q * total:
            return value
    return points[-1][0]


def predict(
    curve: Curve, output_tokens: float, rate: float, max_num_seqs: int, max_queue: int
) -> Prediction:
    """Latency of one replica at Poisson ``rate`` with ``max_num_seqs`` (a measured level)."""
    levels = [scale_level(level, output_tokens) for level in curve.levels]
    if max_num_seqs not in {lv.concurrency for lv in levels}:
        raise ValueError(f"max_num_seqs {max_num_seqs} is not a measured level of {curve.system}")
    used = [lv for lv in levels if lv.concurrency <= max_num_seqs]
    states = {k: _interpolated(used, k) for k in range(1, max_num_seqs + 1)}
    capacity = states[max_num_seqs][0]
    top = max_num_seqs + max_queue
    log_p = [0.0]
    for n in range(1, top + 1):
        log_p.append(log_p[-1] + math.log(rate) - math.log(states[min(n, max_num_seqs)][0]))
    peak = max(log_p)
    p = [math.exp(v - peak) for v in log_p]
    norm = sum(p)
    p = [v / norm for v in p]
    accepted = 1.0 - p[top]
    ttft_points: list[tuple[float, float]] = []
    e2e_points: list[tuple[float, float]] = []
    for n in range(top):
        if p[n] < 1e-12:
            continue
        _, ttft, e2e = states[min(n + 1, max_num_seqs)]
        wait = (n - max_num_seqs + 1) / capacity if n >= max_num_seqs else 0.0
        weight = p[n] / _GRID
        ttft_points.extend((wait + t, weight) for t in ttft)
        e2e_points.extend((wait + e, weight) for e in e2e)
    mean_n = sum(n * pn for n, pn in enumerate(p))
    return Prediction(
        rate_rps=rate,
        max_num_seqs=max_num_seqs,
        capacity_rps=capacity,
        utilization=rate / capacity,
        reject_fraction=p[top],
        mean_in_system=mean_n,
        mean_e2e_s=mean_n / (rate * accepted),
        ttft_p95_s=_weighted_quantile(ttft_points, 0.95),
        e2e_p95_s=_weighted_quantile(e2e_points, 0.95),
        above_measured=sum(p[max_num_seqs:top]) / accepted,
        sources=tuple(lv.source for lv in used),
    )
