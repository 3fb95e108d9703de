"""Summary statistics of a run: percentiles, throughput and goodput under SLOs.

Pure functions over :class:`bench.client.RequestResult` tuples. Warm-up results are dropped
before anything is computed. Definitions (stated once, used everywhere):

- TTFT: request start to the first content chunk (non-streaming: to the whole response).
- ITL: every gap between consecutive content chunks, pooled over all requests.
- TPOT of one request: the mean of its gaps, ``(last_chunk - first_chunk) / (chunks - 1)``.
- Output tokens/s: successful requests' output tokens over the measured wall time (first
  start to last end).
- Goodput: requests that succeeded with TTFT <= ``slo_ttft_ms`` and TPOT <= ``slo_itl_ms``,
  as a fraction of all measured requests and as a rate per second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.client import RequestResult


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation; ``None`` when empty."""
    if not 0.0 <= q <= 100.0:
        raise ValueError("q must be within [0, 100]")
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class Distribution:
    """p50/p95/p99/mean/max of one quantity, in milliseconds; ``None`` fields when no samples."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of_seconds(cls, values: Sequence[float]) -> Distribution:
        ms = [v * 1000.0 for v in values]
        return cls(
            count=len(ms),
            mean=sum(ms) / len(ms) if ms else None,
            p50=percentile(ms, 50),
            p95=percentile(ms, 95),
            p99=percentile(ms, 99),
            max=max(ms) if ms else None,
        )


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_ms: float | None = None
    itl_ms: float | None = None


def tpot(result: RequestResult) -> float | None:
    """Mean gap between content chunks of one request (seconds); ``None`` under two chunks."""
    times = result.chunk_times
    if len(times) < 2:
        return None
    return (times[-1] - times[0]) / (len(times) - 1)


def meets_slo(result: RequestResult, slo: Slo) -> bool:
    if not result.ok:
        return False
    if slo.ttft_ms is not None and (result.ttft is None or result.ttft * 1000 > slo.ttft_ms):
        return False
    if slo.itl_ms is not None:
        mean_gap = tpot(result)
        # A single-chunk answer has no gaps: nothing to violate.
        if mean_gap is not None and mean_gap * 1000 > slo.itl_ms:
            return False
    return True


@dataclass(frozen=True, slots=True)
class Summary:
    """Everything the tables and plots show about one (system, load level) run."""

    requests: int
    ok: int
    errors: int
    wall_s: float
    output_tokens: int
    prompt_tokens: int | None
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: Distribution
    itl_ms: Distribution
    tpot_ms: Distribution
    e2e_ms: Distribution
    goodput_fraction: float | None
    goodput_per_s: float | None
    tokens_from_usage: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measured_wall(results: Sequence[RequestResult]) -> float:
    """First start to last end of the given results (0 when empty)."""
    if not results:
        return 0.0
    return max(r.end for r in results) - min(r.start for r in results)


def summarize(
    results: Sequence[RequestResult], slo: Slo = Slo(), wall_s: float | None = None
) -> Summary:
    """Summarise non-warm-up results; ``wall_s`` defaults to their first start to last end."""
    measured = [r for r in results if not r.warmup]
    good = [r for r in measured if r.ok]
    wall = measured_wall(measured) if wall_s is None else wall_s
    out_tokens = sum(r.output_tokens for r in good)
    prompt_counts = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    gaps = [g for r in good for g in r.itls]
    tpots = [t for t in (tpot(r) for r in good) if t is not None]
    slo_active = slo.ttft_ms is not None or slo.itl_ms is not None
    meeting = sum(1 for r in measured if meets_slo(r, slo)) if slo_active else None
    return Summary(
        requests=len(measured),
        ok=len(good),
        errors=len(measured) - len(good),
        wall_s=wall,
        output_tokens=out_tokens,
        prompt_tokens=sum(prompt_counts) if prompt_counts else None,
        output_tokens_per_s=out_tokens / wall if wall > 0 else 0.0,
        requests_per_s=len(good) / wall if wall > 0 else 0.0,
        ttft_ms=Distribution.of_seconds([r.ttft for r in good if r.ttft is not None]),
        itl_ms=Distribution.of_seconds(gaps),
        tpot_ms=Distribution.of_seconds(tpots),
        e2e_ms=Distribution.of_seconds([r.e2e for r in good]),
        goodput_fraction=(meeting / len(measured) if measured else None)
        if meeting is not None
        else None,
        goodput_per_s=(meeting / wall if wall > 0 else 0.0) if meeting is not None else None,
        tokens_from_usage=bool(good) and all(r.tokens_from_usage for r in good),
    )
