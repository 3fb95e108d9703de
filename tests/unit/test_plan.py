"""``llmso plan``: the queueing step against closed forms, the decisions, and the CLI on
the committed benchmark results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.plan.cli import main as plan_main
from bench.plan.inputs import Curve, Level, ModelProfile, Prices, Slo, load_cold_starts
from bench.plan.model import predict
from bench.plan.recommend import recommend

ROOT = Path(__file__).resolve().parents[2]


def _level(c: int, e2e: float, ttft: float = 0.1, n: int = 50) -> Level:
    return Level(
        concurrency=c,
        requests_per_s=c / e2e,
        output_tokens_per_s=64 * c / e2e,
        ttft_s=(ttft,) * n,
        e2e_s=(e2e,) * n,
        output_tokens=64.0,
        prompt_tokens=50.0,
        source=f"synthetic@c={c}",
    )


def test_constant_speed_server_is_mm1() -> None:
    """One slot, 1 s per request: the flow-equivalent server is M/M/1 with mu = 1."""
    curve = Curve("one", (_level(1, 1.0),))
    p = predict(curve, 64, rate=0.5, max_num_seqs=1, max_queue=400)
    assert p.capacity_rps == pytest.approx(1.0)
    assert p.mean_in_system == pytest.approx(0.5 / (1 - 0.5), rel=1e-6)  # rho / (1 - rho)
    assert p.mean_e2e_s == pytest.approx(2.0, rel=1e-6)  # Little: L / lambda
    assert p.reject_fraction < 1e-9
    # An arrival finding n waits n seconds: P(N >= n) = rho^n, so the p95 is at n = 4.
    assert p.e2e_p95_s == pytest.approx(5.0)


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
    assert p.reject_fraction > 0.5 and p.above_measured > 0.9


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
