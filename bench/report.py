"""Results on disk: one JSON file (raw samples + summaries), a markdown table and a PNG plot.

A :class:`RunRecord` is one (system, load level, stream mode) measurement. Writers are pure
functions of a list of records; the plot uses matplotlib's Agg backend, selected per figure
(no global ``matplotlib.use`` at import time).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.client import RequestResult
from bench.stats import Distribution, Summary


@dataclass(frozen=True, slots=True)
class RunRecord:
    system: str
    load: str
    concurrency: int | None
    rate: float | None
    stream: bool
    summary: Summary
    client_cpu_ms_per_request: float | None
    server_cpu_ms_per_request: float | None
    samples: tuple[RequestResult, ...]
    server_cpu_rounds: tuple[float, ...] = ()
    """Each round's server CPU ms per request when the level ran in several rounds
    (``server_cpu_ms_per_request`` is then their median)."""
    round_summaries: tuple[Summary, ...] = ()
    """Each round's own summary when the level ran in several rounds (``summary`` pools
    their samples), for figures taken per round and then their median."""

    def to_json(self, with_samples: bool = True) -> dict[str, Any]:
        data: dict[str, Any] = {
            "system": self.system,
            "load": self.load,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "stream": self.stream,
            "summary": self.summary.to_json(),
            "client_cpu_ms_per_request": self.client_cpu_ms_per_request,
            "server_cpu_ms_per_request": self.server_cpu_ms_per_request,
        }
        if self.server_cpu_rounds:
            data["server_cpu_rounds"] = list(self.server_cpu_rounds)
        if self.round_summaries:
            data["round_summaries"] = [summary.to_json() for summary in self.round_summaries]
        if with_samples:
            data["samples"] = [s.to_json() for s in self.samples]
        return data


def write_json(path: Path, records: Sequence[RunRecord], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "runs": [r.to_json() for r in records]}
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _triple(d: Distribution) -> str:
    return f"{_ms(d.p50)} / {_ms(d.p95)} / {_ms(d.p99)}"


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(records: Sequence[RunRecord]) -> str:
    """One row per record, in the order given."""
    head = (
        "| system | load | stream | ok/n | req/s | out tok/s | TTFT ms p50/p95/p99 "
        "| ITL ms p50/p95/p99 | E2E ms p50/p95/p99 | goodput | server CPU ms/req "
        "| client CPU ms/req |"
    )
    rows = [head, "|" + "---|" * 12]
    for r in records:
        s = r.summary
        goodput = "-" if s.goodput_fraction is None else f"{s.goodput_fraction:.0%}"
        rows.append(
            f"| {r.system} | {r.load} | {'yes' if r.stream else 'no'} | {s.ok}/{s.requests} "
            f"| {s.requests_per_s:.2f} | {s.output_tokens_per_s:.1f} | {_triple(s.ttft_ms)} "
            f"| {_triple(s.itl_ms)} | {_triple(s.e2e_ms)} | {goodput} "
            f"| {_server_cpu(r)} | {_opt(r.client_cpu_ms_per_request, '.2f')} |"
        )
    return "\n".join(rows) + "\n"


def _server_cpu(r: RunRecord) -> str:
    """The figure, and each round's after it when there were several (median first)."""
    figure = _opt(r.server_cpu_ms_per_request, ".2f")
    if len(r.server_cpu_rounds) < 2:
        return figure
    return f"{figure} ({' / '.join(f'{v:.2f}' for v in r.server_cpu_rounds)})"


def overhead_table(records: Sequence[RunRecord], baseline: str) -> str:
    """Each non-baseline record against the baseline's record at the same load and mode."""
    base = {(r.load, r.stream): r for r in records if r.system == baseline}
    rows = [
        f"| system | load | stream | TTFT p50 +ms | E2E p50 +ms | E2E p99 +ms "
        f"| tok/s ratio | server CPU ms/req (vs {baseline}) |",
        "|" + "---|" * 8,
    ]
    for r in records:
        ref = base.get((r.load, r.stream))
        if r.system == baseline or ref is None:
            continue

        def delta(a: float | None, b: float | None) -> str:
            return "-" if a is None or b is None else f"{a - b:+.2f}"

        ratio = (
            r.summary.output_tokens_per_s / ref.summary.output_tokens_per_s
            if ref.summary.output_tokens_per_s
            else None
        )
        rows.append(
            f"| {r.system} | {r.load} | {'yes' if r.stream else 'no'} "
            f"| {delta(r.summary.ttft_ms.p50, ref.summary.ttft_ms.p50)} "
            f"| {delta(r.summary.e2e_ms.p50, ref.summary.e2e_ms.p50)} "
            f"| {delta(r.summary.e2e_ms.p99, ref.summary.e2e_ms.p99)} "
            f"| {_opt(ratio, '.3f')} | {_opt(r.server_cpu_ms_per_request, '.2f')} "
            f"({_opt(ref.server_cpu_ms_per_request, '.2f')}) |"
        )
    return "\n".join(rows) + "\n"


def _ttft_p50(s: Summary) -> float | None:
    return s.ttft_ms.p50


def _itl_p50(s: Summary) -> float | None:
    return s.itl_ms.p50


def _e2e_p50(s: Summary) -> float | None:
    return s.e2e_ms.p50


_PANELS: tuple[tuple[str, Callable[[Summary], float | None]], ...] = (
    ("TTFT p50 (ms)", _ttft_p50),
    ("ITL p50 (ms)", _itl_p50),
    ("E2E p50 (ms)", _e2e_p50),
)


def plot(path: Path, records: Sequence[RunRecord], title: str) -> None:
    """Latency (TTFT, ITL, E2E p50) against output tokens/s; one line per system and mode."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import ScalarFormatter

    modes = {r.stream for r in records}
    series: dict[str, list[RunRecord]] = {}
    for r in records:
        name = r.system if len(modes) == 1 else f"{r.system} ({'stream' if r.stream else 'whole'})"
        series.setdefault(name, []).append(r)
    fig = Figure(figsize=(15, 4.8))
    FigureCanvasAgg(fig)  # type: ignore[no-untyped-call]
    for k, (ylabel, metric) in enumerate(_PANELS):
        ax = fig.add_subplot(1, 3, k + 1)
        for name, recs in series.items():
            points: list[tuple[float, float, str]] = []
            for r in recs:
                value = metric(r.summary)
                if value is not None:
                    points.append((r.summary.output_tokens_per_s, value, r.load))
            points.sort()
            if not points:
                continue
            xs = [p[0] for p in points]
            ys = [p[1] for p in points]
            ax.plot(xs, ys, marker="o", label=name)
            for x, y, load in points:
                ax.annotate(load, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel("output tokens/s (aggregate)")
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.grid(True, which="both", alpha=0.3)
        if k == 0 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
