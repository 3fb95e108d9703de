"""``llmso plan`` output: ``plan.md`` (every number with its source), ``plan.json`` and
``plan.png`` (per model: predicted p95 against offered rate with the SLO line and the
measured points; daily cost against replicas)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.plan.inputs import Curve, Profile
from bench.plan.model import predict
from bench.plan.recommend import Recommendation


def to_json(recs: Sequence[Recommendation], profile: Profile) -> dict[str, Any]:
    models = []
    for r in recs:
        p = r.choice.prediction
        mp = profile.models[r.model]
        models.append(
            {
                "model": r.model,
                "system": r.system,
                "feasible": r.feasible,
                "resident": not r.lazy,
                "max_num_seqs": p.max_num_seqs,
                "replicas": r.choice.replicas,
                "peak_rps": r.peak_rps,
                "per_replica": {
                    "rate_rps": p.rate_rps,
                    "capacity_rps": p.capacity_rps,
                    "utilization": p.utilization,
                    "ttft_p95_ms": p.ttft_p95_s * 1000,
                    "e2e_p95_ms": p.e2e_p95_s * 1000,
                    "mean_e2e_ms": p.mean_e2e_s * 1000,
                    "reject_fraction": p.reject_fraction,
                    "queued_fraction": p.queued_fraction,
                },
                "headroom_tokens_per_s": r.headroom_tokens_per_s,
                "cold_start_s": r.cold_start_s,
                "cold_start_source": r.cold_start_source,
                "cold_request_share": r.cold_share,
                "unloaded_hours_per_day": r.unloaded_hours_per_day,
                "cost_per_day": r.cost_per_day,
                "resident_cost_per_day": r.resident_cost_per_day,
                "lazy_cost_per_day": r.lazy_cost_per_day,
                "cost_per_million_output_tokens": r.cost_per_million_output_tokens,
                "output_tokens_per_day": r.output_tokens_per_day,
                "engine": {
                    "prefill_fixed_ms": p.engine.prefill_fixed_s * 1000,
                    "prefill_per_token_ms": p.engine.prefill_per_token_s * 1000,
                    "decode_step_ms": {str(c): s * 1000 for c, s in p.engine.decode_steps},
                    "mean_prompt_tokens": p.engine.mean_prompt_tokens,
                },
                "sources": list(p.sources),
                "notes": r.notes,
                "config": r.config_snippet(mp.max_queue, mp.idle_ttl_s),
            }
        )
    return {"models": models}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def markdown(recs: Sequence[Recommendation], profile: Profile) -> str:
    out = ["# llmso plan", ""]
    out.append(
        "| model | resident | max_num_seqs | replicas | TTFT p95 ms | E2E p95 ms "
        "| utilization | headroom tok/s | cost/day | cost / 1M out tok |"
    )
    out.append("|" + "---|" * 10)
    for r in recs:
        p = r.choice.prediction
        out.append(
            f"| {r.model} | {'lazy' if r.lazy else 'resident'} | {p.max_num_seqs} "
            f"| {r.choice.replicas} | {_ms(p.ttft_p95_s)} | {_ms(p.e2e_p95_s)} "
            f"| {p.utilization:.0%} | {r.headroom_tokens_per_s:.0f} | {r.cost_per_day:.2f} "
            f"| {r.cost_per_million_output_tokens:.2f} |"
        )
    for r in recs:
        out.extend(_explain(r, profile))
    return "\n".join(out) + "\n"


def _explain(r: Recommendation, profile: Profile) -> list[str]:
    p = r.choice.prediction
    mp = profile.models[r.model]
    slo = profile.slo_of(r.model)
    prices = profile.prices_of(r.model)
    lines = ["", f"## {r.model}", ""]
    verdict = "meets" if r.feasible else "does NOT meet"
    lines.append(
        f"- Peak {r.peak_rps:g} req/s (profile), split over {r.choice.replicas} replica(s): "
        f"{p.rate_rps:.3g} req/s each; this {verdict} the SLO "
        f"(TTFT p95 <= {slo.ttft_p95_ms} ms, E2E p95 <= {slo.e2e_p95_ms} ms)."
    )
    lines.append(
        f"- Curve: system `{r.system}`, measured levels "
        + ", ".join(f"`{s}`" for s in p.sources)
        + f"; capacity at max_num_seqs={p.max_num_seqs}: {p.capacity_rps:.3g} req/s "
        "(Little's law: concurrency / mean E2E of that level)."
    )
    e = p.engine
    steps = ", ".join(f"s({c}) = {s * 1000:.1f} ms" for c, s in e.decode_steps)
    lines.append(
        f"- Engine fitted to those levels (docs/plan.md): a prefill step costs "
        f"{e.prefill_fixed_s * 1000:.1f} ms + {e.prefill_per_token_s * 1000:.2f} ms per prompt "
        f"token (Theil-Sen line of TTFT on prompt tokens at the lowest level); a decode step "
        f"of d sequences: {steps} (median inter-token gap at concurrency d); prompts: the "
        f"measured lengths, mean {e.mean_prompt_tokens:.0f} tokens."
    )
    lines.append(
        f"- Predicted per replica (that engine simulated over 4,000 Poisson arrivals): "
        f"TTFT p95 {_ms(p.ttft_p95_s)} ms, E2E p95 {_ms(p.e2e_p95_s)} ms, mean E2E "
        f"{_ms(p.mean_e2e_s)} ms, utilization {p.utilization:.0%}, rejected "
        f"{p.reject_fraction:.2%}, waited for a free slot {p.queued_fraction:.1%}."
    )
    lines.append(
        f"- Headroom at peak: {r.headroom_tokens_per_s:.0f} output tokens/s "
        f"(replicas x capacity x {mp.output_tokens:g} tokens - peak x {mp.output_tokens:g})."
    )
    cold = "unknown" if r.cold_start_s is None else f"{r.cold_start_s:.1f} s"
    lines.append(
        f"- Cold start: {cold} ({r.cold_start_source}); lazy would be unloaded "
        f"{r.unloaded_hours_per_day:.1f} h/day (idle_ttl {mp.idle_ttl_s:g} s) and "
        + (
            "-"
            if r.cold_share is None
            else f"{r.cold_share:.3%} of requests would meet a cold start"
        )
        + f"; chosen: {'lazy' if r.lazy else 'resident'}."
    )
    lazy_cost = "-" if r.lazy_cost_per_day is None else f"{r.lazy_cost_per_day:.2f}"
    lines.append(
        f"- Cost: {prices.machine_hour:g}/machine-hour (profile) -> resident "
        f"{r.resident_cost_per_day:.2f}/day, lazy {lazy_cost}/day; "
        f"{r.output_tokens_per_day:,.0f} output tokens/day -> "
        f"{r.cost_per_million_output_tokens:.2f} per 1M output tokens."
    )
    lines.extend(f"- Note: {note}" for note in r.notes)
    lines.extend(["", "```yaml", r.config_snippet(mp.max_queue, mp.idle_ttl_s).rstrip(), "```"])
    return lines


def plot(
    path: Path, recs: Sequence[Recommendation], curves: dict[str, Curve], profile: Profile
) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.5 * len(recs)))
    FigureCanvasAgg(fig)  # type: ignore[no-untyped-call]
    for row, r in enumerate(recs):
        curve = curves[r.system]
        mp = profile.models[r.model]
        slo = profile.slo_of(r.model)
        ax = fig.add_subplot(len(recs), 2, 2 * row + 1)
        batch = r.choice.prediction.max_num_seqs
        capacity = r.choice.prediction.capacity_rps
        rates = [capacity * f / 20 for f in range(1, 20)]
        preds = [
            predict(curve, mp.output_tokens, x, batch, mp.max_queue, prompt_tokens=mp.prompt_tokens)
            for x in rates
        ]
        ax.plot(rates, [p.e2e_p95_s * 1000 for p in preds], label="predicted E2E p95")
        ax.plot(rates, [p.ttft_p95_s * 1000 for p in preds], label="predicted TTFT p95")
        for level in curve.levels:
            if level.concurrency <= batch:
                e2e = sorted(level.e2e_s)
                e2e_p95 = e2e[int(0.95 * (len(e2e) - 1))] * 1000
                throughput = level.concurrency / (sum(e2e) / len(e2e))
                label = f"measured c={level.concurrency} ({level.output_tokens:.0f} tok)"
                ax.scatter([throughput], [e2e_p95], marker="x", color="black")
                ax.annotate(label, (throughput, e2e_p95))
        for value, label in ((slo.e2e_p95_ms, "E2E SLO"), (slo.ttft_p95_ms, "TTFT SLO")):
            if value is not None:
                ax.axhline(value, linestyle="--", color="red", alpha=0.6)
                ax.annotate(label, (rates[0], value), color="red", fontsize=8)
        ax.axvline(r.choice.prediction.rate_rps, color="gray", alpha=0.5)
        ax.set_xlabel(f"req/s per replica (max_num_seqs={batch})")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.set_title(f"{r.model}: latency vs load")
        ax.legend(fontsize=8)
        cost_ax = fig.add_subplot(len(recs), 2, 2 * row + 2)
        by_replicas: dict[int, bool] = {}
        for choice in r.tried:
            by_replicas[choice.replicas] = by_replicas.get(choice.replicas, False) or (
                choice.meets_slo
            )
        xs = sorted(by_replicas)
        prices = profile.prices_of(r.model)
        costs = [x * 24 * prices.machine_hour for x in xs]
        colors = ["green" if by_replicas[x] else "gray" for x in xs]
        cost_ax.bar(xs, costs, color=colors)
        cost_ax.set_xticks(xs)
        cost_ax.set_xlabel("replicas (green: meets the SLO at peak)")
        cost_ax.set_ylabel("resident cost per day")
        cost_ax.set_title(f"{r.model}: cost vs replicas")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def write(
    out: Path, recs: Sequence[Recommendation], curves: dict[str, Curve], profile: Profile
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.md").write_text(markdown(recs, profile), encoding="utf-8")
    (out / "plan.json").write_text(json.dumps(to_json(recs, profile), indent=1) + "\n")
    plot(out / "plan.png", recs, curves, profile)
