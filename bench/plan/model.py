"""One replica's predicted latency at a Poisson rate: the fitted engine, simulated.

``predict`` fits the engine's step times to the measured curve (``bench.plan.simulator``),
simulates 4,000 requests at ``rate`` (after 200 of warm-up, fixed seed: the same inputs
always give the same plan) and reads the p95s from the simulated distribution. Capacity
is measured, not simulated: Little's law on the closed-loop level ``max_num_seqs``,
``X = max_num_seqs / mean E2E``; utilisation is ``rate / X``.

``max_num_seqs`` must be a measured level, so the engine never runs a batch larger than
one that was measured; load beyond it waits FIFO (and the share that waited is reported).

``predict_schedule`` is the same engine on one given schedule (a replayed load test's
realised arrivals and prompts), simulated 200 times with fresh step-time factors: what the
model says those very requests' p95s were, for ``--validate`` to compare with the measured
ones without the sampling error of the arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.plan.inputs import Curve
from bench.plan.simulator import EngineModel, fit_engine, replay, simulate
from bench.stats import percentile

SIMULATED_REQUESTS = 4000


@dataclass(frozen=True, slots=True)
class Prediction:
    rate_rps: float  # offered to this replica
    max_num_seqs: int
    capacity_rps: float  # measured: max_num_seqs / mean E2E at that level
    utilization: float  # rate / capacity
    reject_fraction: float
    mean_e2e_s: float
    ttft_p95_s: float
    e2e_p95_s: float
    queued_fraction: float  # share of arrivals that found max_num_seqs taken and waited
    engine: EngineModel
    notes: tuple[str, ...]

    @property
    def sources(self) -> tuple[str, ...]:
        return self.engine.sources

    @property
    def mean_in_system(self) -> float:
        """Little's law on the accepted stream."""
        return self.rate_rps * (1 - self.reject_fraction) * self.mean_e2e_s


def capacity(curve: Curve, max_num_seqs: int) -> float:
    level = curve.at(max_num_seqs)
    return level.concurrency / (sum(level.e2e_s) / len(level.e2e_s))


def predict(
    curve: Curve,
    output_tokens: float,
    rate: float,
    max_num_seqs: int,
    max_queue: int,
    *,
    prompt_tokens: float | None = None,
    seed: int = 0,
) -> Prediction:
    """Latency of one replica at Poisson ``rate`` with ``max_num_seqs`` (a measured level).

    ``prompt_tokens`` (the profile's mean) rescales the measured prompt lengths; ``None``
    keeps the measured ones."""
    engine = fit_engine(curve, max_num_seqs)
    notes = list(engine.notes)
    scale = 1.0
    if prompt_tokens is not None:
        scale = prompt_tokens / engine.mean_prompt_tokens
        if abs(scale - 1) > 0.25:
            notes.append(
                f"profile prompt tokens {prompt_tokens:g} vs measured "
                f"{engine.mean_prompt_tokens:.0f}: prefill cost scaled on the fitted line "
                "(an assumption, not a measurement)"
            )
        if prompt_tokens > max(engine.prompt_tokens):
            notes.append("profile prompts are longer than any measured one: extrapolated")
    sim = simulate(
        engine,
        rate=rate,
        output_tokens=output_tokens,
        max_num_seqs=max_num_seqs,
        max_queue=max_queue,
        prompt_scale=scale,
        requests=SIMULATED_REQUESTS,
        seed=seed,
    )
    cap = capacity(curve, max_num_seqs)
    if not sim.e2e_s:
        raise ValueError(f"rate {rate:g}: every simulated request was rejected")
    return Prediction(
        rate_rps=rate,
        max_num_seqs=max_num_seqs,
        capacity_rps=cap,
        utilization=rate / cap,
        reject_fraction=sim.rejected / sim.offered,
        mean_e2e_s=sum(sim.e2e_s) / len(sim.e2e_s),
        ttft_p95_s=_p95(sim.ttft_s),
        e2e_p95_s=_p95(sim.e2e_s),
        queued_fraction=sim.queued / sim.offered,
        engine=engine,
        notes=tuple(notes),
    )


def predict_schedule(
    curve: Curve,
    output_tokens: float,
    arrivals: Sequence[float],
    prompt_tokens: Sequence[int],
    *,
    max_num_seqs: int,
    max_queue: int,
    warmup: int = 0,
) -> tuple[float, float]:
    """Predicted (TTFT p95, E2E p95) of the requests after the first ``warmup`` of one
    schedule: ``arrivals`` (ascending, seconds) with each request's ``prompt_tokens``."""
    sim = replay(
        fit_engine(curve, max_num_seqs),
        arrivals=arrivals,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        max_num_seqs=max_num_seqs,
        max_queue=max_queue,
        warmup=warmup,
    )
    if not sim.e2e_s:
        raise ValueError("every request of the schedule was rejected")
    return _p95(sim.ttft_s), _p95(sim.e2e_s)


def _p95(values: tuple[float, ...]) -> float:
    result = percentile(values, 95)
    assert result is not None  # callers pass a non-empty tuple
    return result
