"""The engine model on a given schedule (``llmso plan --validate``'s replayed arrivals):
exact on deterministic steps, the same engine as the Poisson simulation, and the warm-up
requests of a replay load the engine without being scored; and the fit says which decode
steps it interpolated."""

from __future__ import annotations

import itertools
import random

import pytest

from bench.client import RequestResult
from bench.plan.cli import replayed_p95s
from bench.plan.inputs import Curve, Level, ModelProfile
from bench.plan.simulator import EngineModel, fit_engine, replay, simulate


def _engine(jitter: tuple[float, ...] = (1.0,)) -> EngineModel:
    """A lone prefill costs 0.1 s + 2 ms per prompt token; a decode step 50 ms (any batch)."""
    return EngineModel(
        prefill_fixed_s=0.1,
        prefill_per_token_s=0.002,
        decode_steps=((1, 0.05), (2, 0.05)),
        decode_jitter=jitter,
        prefill_jitter=(1.0,),
        prompt_tokens=(50,),
        sources=("synthetic",),
        notes=(),
    )


def test_requests_far_apart_take_their_own_prefill_and_decode_steps() -> None:
    sim = replay(
        _engine(),
        arrivals=[0.0, 10.0, 20.0],
        prompt_tokens=[50, 100, 200],
        output_tokens=5,
        max_num_seqs=2,
        max_queue=8,
        rounds=3,
    )
    prefill = [0.1 + 0.002 * p for p in (50, 100, 200)]
    assert sim.ttft_s == pytest.approx(prefill * 3)
    assert sim.e2e_s == pytest.approx([p + 4 * 0.05 for p in prefill] * 3)
    assert sim.offered == 9 and sim.rejected == 0


def test_an_arrival_beyond_the_slots_waits_for_one_to_free() -> None:
    """One slot, two requests at once: the second starts when the first has finished."""
    sim = replay(
        _engine(),
        arrivals=[0.0, 0.0],
        prompt_tokens=[50, 50],
        output_tokens=3,
        max_num_seqs=1,
        max_queue=8,
        rounds=1,
    )
    alone = 0.2 + 2 * 0.05
    assert sim.e2e_s == pytest.approx([alone, 2 * alone])
    assert sim.queued == 1


def test_replaying_the_poisson_schedule_is_the_poisson_simulation() -> None:
    """``simulate`` draws arrivals and prompts and runs the same engine ``replay`` runs:
    on the schedule it drew (same seed), with steps that do not vary, both agree."""
    rate, total, warmup = 3.0, 600, 50
    rng = random.Random(7)
    arrivals = list(itertools.accumulate(rng.expovariate(rate) for _ in range(total)))
    engine = _engine()
    prompts = [rng.choice(engine.prompt_tokens) for _ in range(total)]
    kwargs = {"output_tokens": 6, "max_num_seqs": 2, "max_queue": 64}
    poisson = simulate(engine, rate=rate, requests=total - warmup, warmup=warmup, seed=7, **kwargs)
    again = replay(
        engine, arrivals=arrivals, prompt_tokens=prompts, warmup=warmup, rounds=1, **kwargs
    )
    assert again.e2e_s == pytest.approx(poisson.e2e_s)
    assert again.queued == poisson.queued > 0


def test_rounds_draw_fresh_step_factors() -> None:
    sim = replay(
        _engine(jitter=(0.5, 1.5)),
        arrivals=[0.0],
        prompt_tokens=[50],
        output_tokens=20,
        max_num_seqs=2,
        max_queue=8,
        rounds=50,
    )
    assert len(set(sim.e2e_s)) > 10
    assert min(sim.e2e_s) < 0.2 + 19 * 0.05 < max(sim.e2e_s)


def _result(index: int, start: float, prompt_tokens: int, *, warmup: bool) -> RequestResult:
    return RequestResult(
        index=index,
        prompt_index=0,
        ok=True,
        status=200,
        start=start,
        e2e=1.0,
        ttft=0.1,
        chunk_times=(),
        output_tokens=3,
        prompt_tokens=prompt_tokens,
        tokens_from_usage=True,
        warmup=warmup,
    )


def test_the_replayed_warmup_loads_the_engine_but_is_not_scored() -> None:
    """Two warm-up requests hold the only slot when the measured one arrives: it waits
    for both, and only its latency is the p95."""
    level = Level(
        concurrency=1,
        requests_per_s=3.0,
        output_tokens_per_s=9.0,
        ttft_s=(0.2,) * 5,
        e2e_s=(0.3,) * 5,
        output_tokens=3.0,
        prompt_tokens=50.0,
        source="synthetic@c=1",
        prompt_tokens_s=(50,) * 5,
        output_tokens_s=(3,) * 5,
        itl_s=(0.05,) * 10,
    )
    model = ModelProfile.model_validate({"system": "s", "rate_rps": 1.0, "output_tokens": 3})
    results = [
        _result(0, 0.1, 50, warmup=False),
        _result(1, 0.0, 50, warmup=True),
        _result(2, 0.0, 50, warmup=True),
    ]
    ttft, e2e = replayed_p95s(Curve("s", (level,)), model, results, max_num_seqs=1)
    assert ttft == pytest.approx((0.6 - 0.1 + 0.2) * 1000)
    assert e2e == pytest.approx((0.9 - 0.1) * 1000)


def _closed_level(concurrency: int, itl: float) -> Level:
    return Level(
        concurrency=concurrency,
        requests_per_s=1.0,
        output_tokens_per_s=8.0,
        ttft_s=(0.2,) * 4,
        e2e_s=(0.2 + 7 * itl,) * 4,
        output_tokens=8.0,
        prompt_tokens=50.0,
        source=f"synthetic@c={concurrency}",
        prompt_tokens_s=(50,) * 4,
        output_tokens_s=(8,) * 4,
        itl_s=(itl,) * 28,
    )


def test_the_fit_names_the_batch_sizes_it_interpolated() -> None:
    """A decode step's cost need not be monotone in the batch: one that was not measured
    is interpolated, and the fit says which."""
    sparse = fit_engine(Curve("s", (_closed_level(1, 0.05), _closed_level(4, 0.07))), 4)
    assert sparse.decode_step(3) == pytest.approx(0.05 + 0.02 * 2 / 3)
    assert any("batch 2, 3 interpolated" in note for note in sparse.notes)
    levels = (0.05, 0.08, 0.1, 0.07)
    full = fit_engine(Curve("f", tuple(_closed_level(c, s) for c, s in enumerate(levels, 1))), 4)
    assert full.decode_step(3) == pytest.approx(0.1)
    assert not any("interpolated" in note for note in full.notes)
