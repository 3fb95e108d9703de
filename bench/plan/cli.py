"""``llmso plan``: recommend per model from measured bench results, or check a prediction.

    llmso plan --results R.json [R2.json ...] --profile traffic.yaml [--metrics scrape.txt]
               [--out DIR]
    llmso plan --results R.json --profile traffic.yaml --validate --base-url URL
               [--model NAME] [--rates 0.5,1] [--num-requests 20] [--max-num-seqs N]

``--validate`` replays each rate (default: the profile's peak) open loop (Poisson arrivals,
``bench.loadgen``; prompts drawn at random, seeded, from the built-in ones or ``--prompts``)
against a running gateway and prints predicted vs measured p95 for one replica with that
gateway's ``max_num_seqs``, with a bootstrap interval of the measured p95, and the same model's
p95 on the replay's realised arrivals and prompts. Exit codes: 0 ok,
1 no request succeeded, 2 bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import ValidationError

from bench.client import RequestOptions, RequestResult
from bench.loadgen import LoadSpec, new_session, run_level
from bench.plan.inputs import Curve, ModelProfile, Profile, load_cold_starts, load_curves
from bench.plan.inputs import load_profile as read_profile
from bench.plan.model import predict, predict_schedule
from bench.plan.recommend import Recommendation, recommend
from bench.plan.report import markdown, write
from bench.prompts import Prompt, builtin_prompts, load_prompts
from bench.stats import percentile, summarize

log = logging.getLogger("bench.plan")


def _rates(text: str) -> tuple[float, ...]:
    values = tuple(float(v) for v in text.split(",") if v.strip())
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("expected positive numbers like 0.5,1")
    return values


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmso plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, nargs="+", required=True, help="bench results.json")
    p.add_argument("--profile", type=Path, required=True, help="Traffic profile YAML.")
    p.add_argument("--metrics", type=Path, nargs="*", default=(), help="/metrics scrapes.")
    p.add_argument("--out", type=Path, default=None, help="Write plan.{md,json,png} here.")
    p.add_argument("--validate", action="store_true", help="Replay against --base-url.")
    p.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", default=None, help="Validate this profile model only.")
    p.add_argument("--rates", type=_rates, default=None, help="Default: the profile's peak.")
    p.add_argument("--num-requests", type=int, default=60, help="Per replayed rate.")
    p.add_argument("--prompts", type=Path, default=None, help="JSON-lines prompts to replay.")
    p.add_argument("--max-num-seqs", type=int, default=None, help="The gateway's setting.")
    p.add_argument("--seed", type=int, default=0, help="Arrivals and prompt draw.")
    return p


def plan(
    curves: dict[str, Curve], profile: Profile, cold_starts: dict[str, float]
) -> list[Recommendation]:
    recs = []
    for name, model in profile.models.items():
        if model.system not in curves:
            known = ", ".join(sorted(curves)) or "none"
            raise ValueError(f"model {name!r}: no measured system {model.system!r} ({known})")
        cold: tuple[float | None, str]
        if name in cold_starts:
            cold = (cold_starts[name], "llmso_model_load_seconds mean from the scrape")
        elif model.cold_start_s is not None:
            cold = (model.cold_start_s, "cold_start_s in the profile, not measured here")
        else:
            cold = (None, "not measured")
        recs.append(
            recommend(
                name,
                curves[model.system],
                model,
                slo=profile.slo_of(name),
                prices=profile.prices_of(name),
                cold_start=cold,
            )
        )
    return recs


@dataclass(frozen=True, slots=True)
class Check:
    model: str
    rate: float
    utilization: float  # rate / the measured capacity at max_num_seqs
    max_num_seqs: int
    ok: int
    requests: int
    predicted_ttft_p95_ms: float
    measured_ttft_p95_ms: float | None
    predicted_e2e_p95_ms: float
    measured_e2e_p95_ms: float | None
    # 90 % bootstrap interval of the measured E2E p95 (its sampling error)
    measured_e2e_p95_interval_ms: tuple[float, float] | None
    # the replay's 10th-percentile inter-token gap over the calibration's at its lowest
    # level: well above 1, the machine ran slower during the replay than when calibrated
    speed_ratio: float | None = None
    # the same model on the replay's own arrivals and prompts (no arrival sampling error)
    replayed_ttft_p95_ms: float | None = None
    replayed_e2e_p95_ms: float | None = None

    @property
    def e2e_error(self) -> float | None:
        return _error(self.predicted_e2e_p95_ms, self.measured_e2e_p95_ms)

    @property
    def ttft_error(self) -> float | None:
        return _error(self.predicted_ttft_p95_ms, self.measured_ttft_p95_ms)

    @property
    def replayed_e2e_error(self) -> float | None:
        return _error(self.replayed_e2e_p95_ms, self.measured_e2e_p95_ms)

    @property
    def replayed_ttft_error(self) -> float | None:
        return _error(self.replayed_ttft_p95_ms, self.measured_ttft_p95_ms)


def _error(predicted: float | None, measured: float | None) -> float | None:
    """predicted / measured - 1 (negative: the prediction is low)."""
    if predicted is None or measured is None:
        return None
    return predicted / measured - 1.0


def replayed_p95s(
    curve: Curve,
    model: ModelProfile,
    results: Sequence[RequestResult],
    *,
    max_num_seqs: int,
) -> tuple[float, float]:
    """The model's (TTFT p95, E2E p95) in ms for the measured requests of ``results``, on
    their realised start times and prompt lengths (warm-up ones run first and load the
    engine but are not scored). A prompt whose length the server did not report gets the
    calibration's mean."""
    ordered = sorted(results, key=lambda r: (not r.warmup, r.start))
    fallback = round(curve.levels[0].prompt_tokens)
    ttft, e2e = predict_schedule(
        curve,
        model.output_tokens,
        [r.start for r in ordered],
        [r.prompt_tokens or fallback for r in ordered],
        max_num_seqs=max_num_seqs,
        max_queue=model.max_queue,
        warmup=sum(r.warmup for r in ordered),
    )
    return ttft * 1000, e2e * 1000


def bootstrap_p95(
    values: Sequence[float], rounds: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """5th and 95th percentile of the p95 of ``rounds`` resamples (with replacement)."""
    rng = random.Random(seed)
    stats = sorted(percentile(rng.choices(values, k=len(values)), 95) or 0.0 for _ in range(rounds))
    return stats[int(0.05 * (rounds - 1))], stats[int(0.95 * (rounds - 1))]


async def validate(
    base_url: str,
    name: str,
    curve: Curve,
    model: ModelProfile,
    *,
    rates: tuple[float, ...],
    max_num_seqs: int,
    num_requests: int,
    seed: int = 0,
    prompts: Sequence[Prompt] | None = None,
) -> list[Check]:
    """Predicted vs measured p95 at each rate for one replica (the running gateway).

    The prediction's batch cap is the highest measured level not above ``max_num_seqs``.
    Each request's prompt is drawn independently (seeded) from ``prompts`` (default: the
    built-in ones), as the model assumes; replaying them in order would make the prompt
    lengths a fixed cycle that the model does not describe. Next to the Poisson prediction
    (what a plan reports) each check carries the model's p95s on the replay's own arrival
    times and prompt lengths (:func:`replayed_p95s`), which the measured ones are compared
    with free of the arrivals' sampling error.
    """
    batch = max(lv.concurrency for lv in curve.levels if lv.concurrency <= max_num_seqs)
    options = RequestOptions(
        base_url=base_url, model=name, max_tokens=round(model.output_tokens), ignore_eos=True
    )
    pool = tuple(prompts or builtin_prompts(256))
    checks = []
    async with new_session(64) as session:
        for k, rate in enumerate(rates):
            predicted = predict(
                curve,
                model.output_tokens,
                rate,
                batch,
                model.max_queue,
                prompt_tokens=model.prompt_tokens,
            )
            draw = random.Random(f"prompts-{seed}-{k}")  # not the arrivals' stream
            chosen = [draw.choice(pool) for _ in range(num_requests + 2)]
            load = LoadSpec(rate=rate, num_requests=num_requests, warmup=2, seed=seed * 1000 + k)
            run = await run_level(session, options, chosen, load)
            summary = summarize(run.results)
            e2e = [r.e2e for r in run.measured if r.ok]
            interval = None
            if e2e:
                low, high = bootstrap_p95(e2e, seed=seed)
                interval = (low * 1000, high * 1000)
            replayed = replayed_p95s(curve, model, run.results, max_num_seqs=batch)
            gaps = [g for r in run.measured if r.ok for g in r.itls]
            calibrated = percentile(curve.levels[0].itl_s, 10)
            fastest = percentile(gaps, 10)
            checks.append(
                Check(
                    model=name,
                    rate=rate,
                    utilization=predicted.utilization,
                    max_num_seqs=batch,
                    ok=summary.ok,
                    requests=summary.requests,
                    predicted_ttft_p95_ms=predicted.ttft_p95_s * 1000,
                    measured_ttft_p95_ms=summary.ttft_ms.p95,
                    predicted_e2e_p95_ms=predicted.e2e_p95_s * 1000,
                    measured_e2e_p95_ms=summary.e2e_ms.p95,
                    measured_e2e_p95_interval_ms=interval,
                    speed_ratio=fastest / calibrated if fastest and calibrated else None,
                    replayed_ttft_p95_ms=replayed[0],
                    replayed_e2e_p95_ms=replayed[1],
                )
            )
    return checks


def _check_table(checks: list[Check]) -> str:
    rows = [
        "| model | rate (util.) | max_num_seqs | ok/n | TTFT p95 pred / meas ms | TTFT error "
        "| E2E p95 pred / meas ms (90 % interval) | E2E error "
        "| E2E p95 on the replayed arrivals ms (error) | speed ratio |",
        "|" + "---|" * 10,
    ]
    for c in checks:
        meas_t = "-" if c.measured_ttft_p95_ms is None else f"{c.measured_ttft_p95_ms:.0f}"
        meas_e = "-" if c.measured_e2e_p95_ms is None else f"{c.measured_e2e_p95_ms:.0f}"
        if c.measured_e2e_p95_interval_ms is not None:
            low, high = c.measured_e2e_p95_interval_ms
            meas_e += f" ({low:.0f}-{high:.0f})"
        err_t = "-" if c.ttft_error is None else f"{c.ttft_error:+.0%}"
        err = "-" if c.e2e_error is None else f"{c.e2e_error:+.0%}"
        speed = "-" if c.speed_ratio is None else f"{c.speed_ratio:.2f}"
        on_replay = "-"
        if c.replayed_e2e_p95_ms is not None and c.replayed_e2e_error is not None:
            on_replay = f"{c.replayed_e2e_p95_ms:.0f} ({c.replayed_e2e_error:+.0%})"
        rows.append(
            f"| {c.model} | {c.rate:g} ({c.utilization:.0%}) | {c.max_num_seqs} "
            f"| {c.ok}/{c.requests} | {c.predicted_ttft_p95_ms:.0f} / {meas_t} | {err_t} "
            f"| {c.predicted_e2e_p95_ms:.0f} / {meas_e} | {err} | {on_replay} | {speed} |"
        )
    return "\n".join(rows) + "\n"


def _run(args: argparse.Namespace) -> int:
    curves = load_curves(args.results)
    profile = read_profile(args.profile)
    cold = load_cold_starts(path.read_text(encoding="utf-8") for path in args.metrics)
    if not args.validate:
        recs = plan(curves, profile, cold)
        if args.out:
            write(args.out, recs, curves, profile)
        print(markdown(recs, profile), end="")
        return 0
    if not args.base_url:
        log.error("--validate needs --base-url")
        return 2
    names = [args.model] if args.model else list(profile.models)
    checks: list[Check] = []
    for name in names:
        model = profile.models[name]
        curve = curves[model.system]
        rates = args.rates or (model.peak_rps,)
        batch = args.max_num_seqs or curve.max_concurrency
        checks += asyncio.run(
            validate(
                args.base_url,
                name,
                curve,
                model,
                rates=rates,
                max_num_seqs=batch,
                num_requests=args.num_requests,
                seed=args.seed,
                prompts=load_prompts(args.prompts) if args.prompts else None,
            )
        )
    print(_check_table(checks), end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        data = [
            {
                **asdict(c),
                "e2e_error": c.e2e_error,
                "ttft_error": c.ttft_error,
                "replayed_e2e_error": c.replayed_e2e_error,
            }
            for c in checks
        ]
        (args.out / "validate.json").write_text(json.dumps(data, indent=1) + "\n")
    return 0 if any(c.ok for c in checks) else 1


def main(argv: list[str]) -> int:
    """Entry point for ``llmso plan ARGS...`` (``argv`` excludes ``plan`` itself)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        return _run(args)
    except (ValueError, OSError, KeyError, ValidationError) as exc:
        print(f"llmso plan: {exc}", file=sys.stderr)
        return 2
