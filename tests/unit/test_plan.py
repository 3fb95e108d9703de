"""``llmso plan``: the engine simulation against closed forms, the fit, the decisions, and
the CLI on the committed benchmark results."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from bench.plan.cli import bootstrap_p95
from bench.plan.cli import main as plan_main
from bench.plan.inputs import Curve, Level, ModelProfile, Prices, Slo, load_cold_starts
from bench.plan.model import predict
from bench.plan.recommend import recommend
from bench.plan.simulator import EngineModel, fit_engine, simulate

ROOT = Path(__file__).resolve().parents[2]


def _level(c: int, e2e: float, ttft: float = 0.1, n: int = 50, tokens: int = 64) -> Level:
    """A closed-loop level where every request took exactly ``ttft`` and ``e2e``."""
    return Level(
        concurrency=c,
        requests_per_s=c / e2e,
        output_tokens_per_s=tokens * c / e2e,
        ttft_s=(ttft,) * n,
        e2e_s=(e2e,) * n,
        output_tokens=float(tokens),
        prompt_tokens=50.0,
        source=f"synthetic@c={c}",
        prompt_tokens_s=(50,) * n,
        output_tokens_s=(tokens,) * n,
        itl_s=((e2e - ttft) / max(tokens - 1, 1),) * n,
    )


def _engine(prefill: float, step: float, batch: int = 1, per_token: float = 0.0) -> EngineModel:
    """Deterministic steps: a lone prefill of the 50-token prompt takes ``prefill + 50 ·
    per_token``, a decode ``step`` (plus ``50 · per_token`` when a prefill joins it)."""
    return EngineModel(
        prefill_fixed_s=prefill,
        prefill_per_token_s=per_token,
        decode_steps=((batch, step),),
        decode_jitter=(1.0,),
        prefill_jitter=(1.0,),
        prompt_tokens=(50,),
        sources=("synthetic",),
        notes=(),
    )


def test_one_slot_one_token_is_md1() -> None:
    """One slot, one output token, 1 s per request: the engine is an M/D/1 queue, whose
    mean sojourn is D + rho D / (2 (1 - rho)) and where a share 1 - rho waits not at all."""
    sim = simulate(
        _engine(1.0, 1.0),
        rate=0.5,
        output_tokens=1,
        max_num_seqs=1,
        max_queue=10_000,
        requests=40_000,
    )
    assert statistics.fmean(sim.e2e_s) == pytest.approx(1.0 + 0.5 / (2 * 0.5), rel=0.03)
    assert sum(1 for e in sim.e2e_s if e < 1.0 + 1e-9) / len(sim.e2e_s) == pytest.approx(
        0.5, abs=0.02
    )
    assert sim.rejected == 0


def test_alone_a_request_takes_one_prefill_and_its_decode_steps() -> None:
    """At a negligible rate nobody shares a step: E2E = prefill + (out - 1) steps."""
    sim = simulate(
        _engine(0.2, 0.05, batch=4),
        rate=1e-3,
        output_tokens=9,
        max_num_seqs=4,
        max_queue=8,
        requests=200,
    )
    assert statistics.median(sim.ttft_s) == pytest.approx(0.2)
    assert statistics.median(sim.e2e_s) == pytest.approx(0.2 + 8 * 0.05)


def test_an_arrival_waits_for_the_running_step() -> None:
    """With four slots nobody queues for a slot at this rate, but an arrival during
    another's prefill (about 1 s) waits for that step's end: the TTFT tail is well above
    one prefill, and a prefill joining a decode step costs its tokens, not the fixed part."""
    sim = simulate(
        _engine(0.05, 0.01, batch=4, per_token=0.019),
        rate=0.3,
        output_tokens=2,
        max_num_seqs=4,
        max_queue=64,
        requests=4000,
    )
    assert min(sim.ttft_s) == pytest.approx(0.01 + 0.95, abs=0.01)  # plus a step boundary
    assert statistics.quantiles(sim.ttft_s, n=20)[-1] > 1.5
    assert sim.queued < 0.01 * sim.offered


def test_fit_recovers_the_prefill_line_despite_a_stall() -> None:
    prompts = (20, 40, 60, 80, 100, 120, 140, 160)
    ttft = [0.04 + 0.0025 * p for p in prompts]
    ttft[3] += 0.5  # one stalled request
    level = dataclasses.replace(
        _level(1, 1.0, n=len(prompts)), ttft_s=tuple(ttft), prompt_tokens_s=prompts
    )
    engine = fit_engine(Curve("fit", (level, _level(2, 1.5))), 2)
    assert engine.prefill_fixed_s == pytest.approx(0.04, abs=1e-6)
    assert engine.prefill_per_token_s == pytest.approx(0.0025, abs=1e-6)
    assert engine.decode_step(1) == pytest.approx(0.9 / 63)
    assert engine.decode_step(2) == pytest.approx(1.4 / 63)
    with pytest.raises(ValueError, match="above the highest measured level"):
        engine.decode_step(3)


def test_batching_lowers_the_wait_and_only_measured_caps_are_allowed() -> None:
    curve = Curve("batch", (_level(1, 1.0), _level(4, 1.5)))
    single = predict(curve, 64, rate=0.8, max_num_seqs=1, max_queue=256)
    batched = predict(curve, 64, rate=0.8, max_num_seqs=4, max_queue=256)
    assert batched.capacity_rps == pytest.approx(4 / 1.5)
    assert batched.e2e_p95_s < single.e2e_p95_s
    with pytest.raises(ValueError, match="not a measured level"):
        predict(curve, 64, rate=0.8, max_num_seqs=8, max_queue=256)


def test_overload_is_reported_as_rejections() -> None:
    curve = Curve("one", (_level(1, 1.0),))
    p = predict(curve, 64, rate=3.0, max_num_seqs=1, max_queue=8)
    assert p.reject_fraction > 0.5 and p.queued_fraction > 0.3


def _profile(**fields: object) -> ModelProfile:
    return ModelProfile.model_validate({"system": "s", "output_tokens": 64, **fields})


def test_replicas_grow_with_the_peak_and_lazy_needs_a_cold_start() -> None:
    curve = Curve("s", (_level(1, 1.0), _level(4, 1.5)))
    slo = Slo(e2e_p95_ms=3000)
    prices = Prices(machine_hour=1.0)
    night = [0.0] * 8 + [1.0] * 16
    low = recommend(
        "m",
        curve,
        _profile(rate_rps=night),
        slo=slo,
        prices=prices,
        cold_start=(None, "not measured"),
    )
    high = recommend(
        "m",
        curve,
        _profile(rate_rps=5.0),
        slo=slo,
        prices=prices,
        cold_start=(None, "not measured"),
    )
    assert low.feasible and high.feasible
    assert high.choice.replicas > low.choice.replicas
    assert not low.lazy and "no cold-start measurement" in " ".join(low.notes)
    measured = recommend(
        "m", curve, _profile(rate_rps=night), slo=slo, prices=prices, cold_start=(2.0, "scrape")
    )
    assert measured.lazy  # 8 h/day unloaded, ~1 cold start/day among ~58k requests
    assert measured.cost_per_day < measured.resident_cost_per_day
    assert measured.unloaded_hours_per_day == pytest.approx(8.0, abs=0.01)
    busy = recommend(
        "m", curve, _profile(rate_rps=0.001), slo=slo, prices=prices, cold_start=(120.0, "scrape")
    )
    assert not busy.lazy  # almost every request would meet the 120 s cold start


def test_cold_starts_from_a_scrape() -> None:
    text = (
        'llmso_model_load_seconds_sum{model="a"} 12.0\n'
        'llmso_model_load_seconds_count{model="a"} 3.0\n'
        'llmso_model_load_seconds_bucket{model="a",le="1.0"} 0.0\n'
    )
    assert load_cold_starts([text]) == {"a": 4.0}


def test_plan_cli_on_the_committed_results(tmp_path: Path) -> None:
    code = plan_main(
        [
            "--results",
            str(ROOT / "docs/benchmarks/models/results.json"),
            "--profile",
            str(ROOT / "docs/plan/example-profile.yaml"),
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    data = json.loads((tmp_path / "plan.json").read_text())
    smol = {m["model"]: m for m in data["models"]}["smollm2"]
    assert smol["feasible"] and smol["per_replica"]["e2e_p95_ms"] <= 8000
    assert all("results.json#llmso-hf-continuous@c=" in s for s in smol["sources"])
    assert "max_num_seqs:" in smol["config"]
    assert (tmp_path / "plan.png").stat().st_size > 0
    assert plan_main(["--results", "missing.json", "--profile", "x.yaml"]) == 2


def test_bootstrap_interval_holds_the_p95_and_narrows_with_more_samples() -> None:
    few = [i / 60 for i in range(60)]
    many = [i / 600 for i in range(600)]
    low, high = bootstrap_p95(few)
    assert low <= statistics.quantiles(few, n=20)[-1] <= high
    many_low, many_high = bootstrap_p95(many)
    assert many_high - many_low < high - low
