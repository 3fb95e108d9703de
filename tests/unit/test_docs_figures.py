"""The benchmark figures the README and docs/benchmarks/README.md quote are the committed
results files' own.

Two tables are checked: the README's benchmark summary (under ``## Benchmarks``) and the
suite index of docs/benchmarks/README.md (under ``## Suites``). A row's label is its
first cell; ``FIGURES`` knows, for each label, the results file(s) it reads and how to
compute the row's figures from them. The figures a row quotes are its **bold** numbers,
in order; each must equal the computed value at the precision printed (``1.33x`` is
checked to two decimals, ``77 %`` to a whole number). The index's ``results`` column
links the files its ``date``, ``machine`` and ``load at start`` columns come from; a file
that records none of one says so (``not in the file``). A row with no known label, or a
known label with no row, fails: a figure cannot be added, or dropped, unchecked.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "benchmarks"
README = ROOT / "README.md"
INDEX = RESULTS / "README.md"
NOT_RECORDED = "not in the file"

_BOLD = re.compile(r"\*\*(.+?)\*\*")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
_LINK = re.compile(r"\]\(([^)]+)\)")


@cache
def _load(name: str) -> Any:
    return json.loads((RESULTS / name).read_text())


def _summary(name: str, system: str, concurrency: int, stream: bool = True) -> dict[str, Any]:
    """One level of a ``llmso bench`` results file: its ``summary``, plus the server's CPU."""
    for run in _load(name)["runs"]:
        if (run["system"], run["concurrency"], run["stream"]) == (system, concurrency, stream):
            return {**run["summary"], "server_cpu": run["server_cpu_ms_per_request"]}
    raise AssertionError(f"{name}: no run of {system} at c={concurrency}, stream={stream}")


def _tok_s(name: str, system: str, concurrency: int) -> float:
    return float(_summary(name, system, concurrency)["output_tokens_per_s"])


def _ttft_p50(name: str, system: str, concurrency: int, stream: bool = True) -> float:
    return float(_summary(name, system, concurrency, stream)["ttft_ms"]["p50"])


def _tok_ratios(name: str, a: str, b: str, levels: tuple[int, ...]) -> list[float]:
    return [_tok_s(name, a, c) / _tok_s(name, b, c) for c in levels]


def _ttft_ratios(name: str, a: str, b: str, levels: tuple[int, ...]) -> list[float]:
    return [_ttft_p50(name, a, c) / _ttft_p50(name, b, c) for c in levels]


def _quant_row(model: str, setting: str) -> dict[str, Any]:
    rows = _load("quantization/results.json")["rows"]
    return next(r for r in rows if (r["model"], r["setting"]) == (model, setting))


def _reused(name: str, policy: str) -> float:
    rows = _load(name)["results"]
    return float(next(r for r in rows if r["policy"] == policy)["reused_prompt_tokens"])


def _budget(mode: str) -> list[float]:
    (row,) = _load(f"budget_close/results-{mode}.json")["modes"]
    return [row["valid"], row["answered"]]


def _failover(name: str, kind: str) -> list[float]:
    summary = _load(name)["summary"][kind]
    return [summary["identical"], summary["trials"]]


def _overhead_added_ttft(system: str, concurrency: int) -> float:
    name = "overhead/results.json"
    return _ttft_p50(name, system, concurrency) - _ttft_p50(name, "direct", concurrency)


def _overhead_cpu(system: str, concurrency: int) -> float:
    return float(_summary("overhead/results.json", system, concurrency)["server_cpu"])


@dataclass(frozen=True)
class Figure:
    files: tuple[str, ...]  # relative to docs/benchmarks/
    compute: Callable[[], list[float]]


def _chat_c1(llmso: str, peer: str) -> float:
    return float(_load("chat_c1/chat_c1.json")["ratios"][llmso][peer]["tok_per_s"])


def _fairness(name: str, tree: str) -> float:
    """b's busy p95 over idle p95, pooled, for the tree whose label starts with ``tree``."""
    pooled = _load(f"fairness/{name}.json")["pooled"]
    (label,) = [label for label in pooled if label.startswith(tree)]
    return float(pooled[label]["p95_busy_over_idle"])


def _median_ratio(path: str, kind: str, key: str, /, **runs: tuple[object, object]) -> float:
    """The median over rounds of the runs matching ``runs``' first values over that of the
    runs matching their second values (``kind``: decode_ms or prefill_ms)."""
    records = _load(path)["runs"]

    def median(side: int) -> float:
        picked = [r for r in records if all(r[f] == pair[side] for f, pair in runs.items())]
        return float(statistics.median(r[kind][key] for r in picked))

    return median(0) / median(1)


def _compiled_step(mode: str, rows: int) -> float:
    """``mode``'s median decode step over the packed runner's (llmso), medians of rounds."""
    runs = _load("compiled_step/results.json")["runs"]

    def median(name: str) -> float:
        return float(
            statistics.median(r["step_ms"] for r in runs if r["mode"] == name and r["rows"] == rows)
        )

    return median(mode) / median("llmso")


def _row_blocks(mode: str, kind: str, key: str) -> float:
    """``mode``'s time over row blocks'."""
    return _median_ratio("row_blocks/results.json", kind, key, mode=(mode, "row-blocks"))


def _glue(setting: str, kind: str, key: str) -> float:
    """The glue's time over the framework ops', at one weight setting."""
    return _median_ratio(
        "glue/results.json",
        kind,
        key,
        setting=(setting, setting),
        mode=("C glue", "framework ops"),
    )


def _int4_tiles(weights: str, over: str, rows: str) -> float:
    """``weights``' median decode step over ``over``'s, SmolLM2's runner."""
    return _median_ratio("int4_tiles/results.json", "decode_ms", rows, kind=(weights, over))


def _shed(system: str, figure: str, at: str | None = None) -> float:
    """One figure of a system in the shed_lag study (``at``: a percentile's key)."""
    value = _load("shed_lag/results.json")["systems"][system][figure]
    return float(value if at is None else value[at])


def _fleet_ratio(system: str, streams: int) -> float:
    """Requests per second through ``system`` over direct, whole run, at ``streams``."""
    runs = _load("fleet/results.json")["runs"]
    rps = {(r["system"], r["concurrency"]): r["summary"]["requests_per_s"] for r in runs}
    return float(rps[(system, streams)] / rps[("direct", streams)])


MODELS = "models/results.json"
GPU = "models-gpu/results.json"
PREFIX = "prefix/results.json"
QWEN = "shapes/qwen2.5-0.5b/results.json"
LLAMA = "shapes/llama-3.2-1b/results.json"
QWEN_Q = "quant_shapes/qwen2.5-0.5b/results.json"
LLAMA_Q = "quant_shapes/llama-3.2-1b/results.json"
SERVE = "quant_serve/results.json"
HF, VLLM, VLLM_COMPILED = "llmso-hf-continuous", "vllm-cpu", "vllm-cpu-compiled"

# The README's benchmark summary, by row label.
README_FIGURES: dict[str, Figure] = {
    "hf / vLLM-CPU compiled (its default), output tok/s, SmolLM2-135M, c = 1 / 4 / 16 / 64 "
    "(Intel Xeon)": Figure(
        (MODELS,), lambda: _tok_ratios(MODELS, HF, VLLM_COMPILED, (1, 4, 16, 64))
    ),
    "hf / vLLM-CPU eager, output tok/s, same run": Figure(
        (MODELS,), lambda: _tok_ratios(MODELS, HF, VLLM, (1, 4, 16, 64))
    ),
    "hf / vLLM-CPU compiled, TTFT p50, same run": Figure(
        (MODELS,), lambda: _ttft_ratios(MODELS, HF, VLLM_COMPILED, (1, 4, 16, 64))
    ),
    "hf / vLLM-CPU eager, TTFT p50, shared 1,008-token prefix, both prefix caches on, "
    "c = 1 / 4 / 16": Figure(
        (PREFIX,),
        lambda: _ttft_ratios(PREFIX, "llmso-hf-prefix-cache", "vllm-cpu-prefix-cache", (1, 4, 16)),
    ),
    "hf / vLLM-CPU compiled, output tok/s, Qwen2.5-0.5B shape, c = 1 / 4 / 16 (Intel Xeon)": Figure(
        (QWEN,), lambda: _tok_ratios(QWEN, HF, VLLM_COMPILED, (1, 4, 16))
    ),
    "hf / vLLM-CPU compiled, output tok/s, Llama-3.2-1B shape, c = 1 / 4 / 16 (Intel Xeon)": Figure(
        (LLAMA,), lambda: _tok_ratios(LLAMA, HF, VLLM_COMPILED, (1, 4, 16))
    ),
    "hf w4a8 / llama.cpp's own llama-server (same Q4_1 GGUF, 16 slots), output tok/s, "
    "c = 1 / 4 / 16 (Intel Xeon)": Figure(
        (SERVE,), lambda: _tok_ratios(SERVE, "hf-w4a8", "llama-server", (1, 4, 16))
    ),
    "hf w4a8 / hf int4 over llama.cpp's own llama-server on the same Q4_1 GGUF, one user "
    "chatting (Intel Xeon)": Figure(
        ("chat_c1/chat_c1.json",),
        lambda: [_chat_c1(ours, "llama-server-q4_1-np1") for ours in ("hf-w4a8", "hf-int4")],
    ),
    "hf bf16 / vLLM-CPU compiled (its default), one user chatting, same run": Figure(
        ("chat_c1/chat_c1.json",), lambda: [_chat_c1("hf-bf16", "vllm-cpu-compiled")]
    ),
    "8 LoRA adapters mixed / the base model alone, output tok/s, c = 16, in process": Figure(
        ("lora/results.json",), lambda: [_load("lora/results.json")["mixed_over_base"]]
    ),
    "added TTFT p50 and server CPU per streamed request, in front of a fake upstream, c = 1": (
        Figure(
            ("overhead/results.json",),
            lambda: [_overhead_added_ttft("gateway", 1), _overhead_cpu("gateway", 1)],
        )
    ),
    "LiteLLM proxy's CPU / llmso's, per streamed request, c = 1 / 16": Figure(
        ("overhead/results.json",),
        lambda: [_overhead_cpu("litellm", c) / _overhead_cpu("gateway", c) for c in (1, 16)],
    ),
    "online TTFT p95 beside a 500-line batch / alone": Figure(
        ("batch/drill.json",), lambda: [_load("batch/drill.json")["measure"]["ttft_p95_ratio"]]
    ),
    "replicas SIGKILLed mid-stream whose answer came out as the uninterrupted one": Figure(
        ("failover/trials.json",), lambda: _failover("failover/trials.json", "kill")
    ),
}


def _plan_example(a: str, b: str) -> float:
    name = "../plan/example/measured/results.json"
    return _tok_s(name, a, 16) / _tok_s(name, b, 16)


# docs/benchmarks/README.md's suite index: the headline column, by suite.
INDEX_FIGURES: dict[str, Figure] = {
    "fleet": Figure(
        ("fleet/results.json",),
        lambda: [_fleet_ratio("llmso-w1", 1024), _fleet_ratio("llmso-w2", 1024)],
    ),
    "shed_lag": Figure(
        ("shed_lag/results.json",),
        lambda: [
            _shed("llmso-25", "served_per_s") / _shed("llmso-off", "served_per_s"),
            _shed("llmso-25", "gap_ms", "p50"),
            _shed("llmso-off", "gap_ms", "p50"),
        ],
    ),
    "chat_c1": Figure(
        ("chat_c1/chat_c1.json",),
        lambda: [
            _chat_c1("hf-w4a8", "llama-server-q4_1-np1"),
            _chat_c1("hf-int4", "llama-server-q4_1-np1"),
            _chat_c1("hf-bf16", "vllm-cpu-compiled"),
        ],
    ),
    "fairness": Figure(
        ("fairness/cpu-default.json", "fairness/cpu-seqs8.json"),
        lambda: [
            _fairness("cpu-default", "this tree"),
            _fairness("cpu-default", "baseline"),
            _fairness("cpu-seqs8", "this tree"),
            _fairness("cpu-seqs8", "baseline"),
        ],
    ),
    "row_blocks": Figure(
        ("row_blocks/results.json",),
        lambda: [
            _row_blocks("64-row steps", "prefill_ms", "81"),
            _row_blocks("64-row steps", "prefill_ms", "262"),
            _row_blocks("32-row prefill", "prefill_ms", "262"),
            _row_blocks("32-row prefill", "prefill_ms", "512"),
            _row_blocks("whole", "decode_ms", "64"),
            _row_blocks("whole", "prefill_ms", "512"),
            _row_blocks("capped", "decode_ms", "32"),
        ],
    ),
    "compiled_step": Figure(
        ("compiled_step/results.json",),
        lambda: [
            _compiled_step("inductor frozen", 1),
            _compiled_step("inductor frozen", 16),
            _compiled_step("inductor", 16),
        ],
    ),
    "int4_tiles": Figure(
        ("int4_tiles/results.json",),
        lambda: [
            _int4_tiles("int4 tiles", "int4 PyTorch kernel", "1"),
            _int4_tiles("int4 tiles", "int4 PyTorch kernel", "16"),
            _int4_tiles("int4 tiles", "bf16", "16"),
        ],
    ),
    "glue": Figure(
        ("glue/results.json",),
        lambda: [
            _glue("none", "decode_ms", "1"),
            _glue("none", "decode_ms", "16"),
            _glue("int4", "decode_ms", "1"),
            _glue("none", "prefill_ms", "512"),
        ],
    ),
    "models": Figure((MODELS,), lambda: _tok_ratios(MODELS, HF, VLLM_COMPILED, (1, 64))),
    "models-gpu": Figure(
        (GPU,),
        lambda: [
            *_tok_ratios(GPU, "llmso-hf-continuous-cuda", "transformers-generate", (1,)),
            _tok_s(GPU, "llmso-hf-continuous-cuda", 64),
        ],
    ),
    "prefix": Figure(
        (PREFIX,),
        lambda: [
            *_ttft_ratios(PREFIX, "llmso-hf-prefix-cache", "vllm-cpu-prefix-cache", (1,)),
            *_ttft_ratios(PREFIX, "llmso-hf-prefix-cache", "llmso-hf-no-prefix-cache", (1,)),
        ],
    ),
    "shapes": Figure(
        (QWEN, LLAMA),
        lambda: [
            *_tok_ratios(QWEN, HF, VLLM_COMPILED, (1, 16)),
            *_tok_ratios(LLAMA, HF, VLLM_COMPILED, (1, 16)),
        ],
    ),
    "quant_shapes": Figure(
        (
            QWEN_Q,
            LLAMA_Q,
            "quant_shapes/llamacpp_c1/qwen2.5-0.5b/results.json",
            "quant_shapes/llamacpp_c1/llama-3.2-1b/results.json",
            "quant_shapes/steps/results.json",
        ),
        lambda: [
            *(_tok_ratios(name, "llmso-hf-int4", HF, (1,))[0] for name in (QWEN_Q, LLAMA_Q)),
            *(_tok_ratios(name, "llmso-hf-int4", HF, (16,))[0] for name in (QWEN_Q, LLAMA_Q)),
        ],
    ),
    "quant_serve": Figure(
        (SERVE,),
        lambda: [
            *_tok_ratios(SERVE, "hf-w4a8", "llama-server", (1, 16)),
            *_tok_ratios(SERVE, "hf-w4a8", "hf-none", (1, 16)),
            *_tok_ratios(SERVE, "hf-int4", "hf-none", (16,)),
            *_tok_ratios(SERVE, "hf-none", "vllm-cpu-compiled", (16,)),
        ],
    ),
    "quantization": Figure(
        ("quantization/results.json",),
        lambda: [
            100 * _quant_row("smollm2", "int4")["first_token_agreement"],
            100 * _quant_row("smollm2", "w4a8")["first_token_agreement"],
            _quant_row("smollm2", "int4")["nll_gap"],
            _quant_row("smollm2", "w4a8")["nll_gap"],
        ],
    ),
    "lora": Figure(
        ("lora/results.json",),
        lambda: [
            _load("lora/results.json")["mixed_over_base"],
            _served_lora("llmso-hf")["mixed"] / _served_lora("llmso-hf")["base"],
            _served_lora("llmso-hf")["mixed"] / _served_lora("vllm-cpu")["mixed"],
        ],
    ),
    "overhead": Figure(
        ("overhead/results.json",),
        lambda: [_overhead_added_ttft("gateway", 1), _overhead_cpu("gateway", 1)],
    ),
    "embeddings": Figure(
        ("embeddings/results.json",),
        lambda: [
            row["llmso"] / row["sentence_transformers"]
            for row in _load("embeddings/results.json")["rows"]
            if "sentence_transformers" in row
        ],
    ),
    "structured": Figure(
        ("structured/results.json",),
        lambda: [
            100 * (_structured()["c=16 json_schema"] / _structured()["c=16 free"] - 1),
        ],
    ),
    "budget_close": Figure(
        ("budget_close/results-off.json", "budget_close/results-on.json"),
        lambda: [*_budget("off"), *_budget("on")],
    ),
    "balance": Figure(
        (
            "balance/results-c1.json",
            "balance/results-c2.json",
            "balance/results-c4.json",
        ),
        lambda: [
            _reused("balance/results-c1.json", "prefix"),
            _reused("balance/results-c1.json", "round_robin"),
        ],
    ),
    "batch": Figure(
        ("batch/drill.json", "batch/survive.json"),
        lambda: [
            _load("batch/drill.json")["measure"]["ttft_p95_ratio"],
            100 * _load("batch/drill.json")["measure"]["batch_share"],
        ],
    ),
    "failover": Figure(
        ("failover/trials.json", "failover/seams.json"),
        lambda: [
            *_failover("failover/trials.json", "kill"),
            *_failover("failover/trials.json", "garbage"),
            *_failover("failover/seams.json", "seam"),
        ],
    ),
    "eval": Figure(
        ("eval/results.json",),
        lambda: [
            _load("eval/results.json")["results"]["llmso_hf"]["acc"],
            _load("eval/results.json")["results"]["vllm_cpu"]["acc"],
        ],
    ),
    "priority": Figure(
        ("priority/cpu-loaded.json",),
        lambda: [
            _load("priority/cpu-loaded.json")["overloaded_high"]["p95_ms"]
            / _load("priority/cpu-loaded.json")["unloaded"]["p95_ms"]
        ],
    ),
    "tradeoffs": Figure(
        ("tradeoffs/tradeoffs.json",),
        lambda: [
            _load("tradeoffs/tradeoffs.json")["lazy_thread"]["llmso_model_load_seconds"],
            _load("tradeoffs/tradeoffs.json")["lazy_thread"]["cold_first_request"]["seconds"],
        ],
    ),
    "plan example": Figure(
        ("../plan/example/measured/results.json",),
        lambda: [
            _plan_example("llmso-hf-continuous", "llmso-hf-sequential"),
            _plan_example("llmso-hf-continuous", "vllm-cpu"),
        ],
    ),
}


def _served_lora(system: str) -> dict[str, float]:
    """Median tok/s of the served part of the LoRA run, per workload."""
    return dict(_load("lora/results.json")["served"]["systems"][system]["median_tok_per_s"])


def _structured() -> dict[str, float]:
    return dict(_load("structured/results.json")["tokens_per_s"])


# --- reading the docs ---------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    where: str
    cells: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.cells[0].replace("**", "").replace("`", "").strip().rstrip("/")


def _table_under(path: Path, heading: str) -> list[Row]:
    """The rows (header and rule left out) of the first table after ``heading``."""
    lines = path.read_text().splitlines()
    if heading not in lines:
        return []  # the test of labels then names what is missing
    start = lines.index(heading)
    rows: list[Row] = []
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("#") and rows:
            break
        if line.startswith("|"):
            cells = tuple(cell.strip() for cell in line.strip().strip("|").split(" | "))
            rows.append(Row(f"{path.relative_to(ROOT)}:{number}", cells))
        elif rows:
            break
    return rows[2:]


def _quoted(cell: str) -> list[str]:
    """The numbers printed in bold in ``cell``, as written."""
    return [n for span in _BOLD.findall(cell) for n in _NUMBER.findall(span)]


def _matches(quoted: str, value: float) -> bool:
    """``quoted`` is ``value`` at the precision it is printed."""
    text = quoted.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10.0**-decimals + 1e-9


def _check(row: Row, cell: str, figure: Figure) -> None:
    quoted = _quoted(cell)
    expected = figure.compute()
    assert len(quoted) == len(expected), f"{row.where}: quotes {quoted}, the files give {expected}"
    wrong = [(q, round(v, 4)) for q, v in zip(quoted, expected, strict=True) if not _matches(q, v)]
    assert wrong == [], f"{row.where} ({row.label}): quoted vs computed {wrong}"


def _linked(cell: str, base: Path) -> list[str]:
    """The files ``cell`` links (relative to ``base``), as paths relative to docs/benchmarks/."""
    return [os.path.relpath(base / link, RESULTS) for link in _LINK.findall(cell)]


# --- the README's summary -----------------------------------------------------------


def _readme_rows() -> list[Row]:
    return _table_under(README, "## Benchmarks")


def test_the_readme_quotes_every_figure_it_is_checked_for() -> None:
    labels = [row.label for row in _readme_rows()]
    assert sorted(labels) == sorted(README_FIGURES)


@pytest.mark.parametrize("row", _readme_rows(), ids=lambda row: row.where)
def test_readme_figure_is_its_results_file(row: Row) -> None:
    figure = README_FIGURES[row.label]
    _, cell, source = row.cells
    assert _linked(source, ROOT) == list(figure.files), f"{row.where}: names {source}"
    _check(row, cell, figure)


# --- the benchmark index ------------------------------------------------------------

INDEX_COLUMNS = (
    "suite",
    "measures",
    "command",
    "results",
    "date",
    "machine",
    "load at start",
    "headline",
)


def _index_rows() -> list[Row]:
    return _table_under(INDEX, "## Suites")


def _recorded(data: Any, keys: tuple[str, ...]) -> Any:
    """The first value under any of ``keys``, searched breadth-first through mappings."""
    level = [data]
    while level:
        for node in level:
            for key in keys:
                if isinstance(node, dict) and key in node:
                    return node[key]
        level = [v for node in level if isinstance(node, dict) for v in node.values()]
    return None


def _meta(name: str) -> tuple[str | None, str | None, float | None]:
    """A results file's date (YYYY-MM-DD), machine and 1-minute load average at the start."""
    data = _load(name)
    when = _recorded(data, ("started_at", "started", "finished_at"))
    machine = _recorded(data, ("cpu_model", "cpu"))
    load = _recorded(data, ("loadavg_at_start",))
    first_load = float(load[0] if isinstance(load, list) else load) if load is not None else None
    return (when[:10] if when else None), machine, first_load


def _check_column(row: Row, cell: str, recorded: list[Any]) -> None:
    values = [v for v in recorded if v is not None]
    if not values:
        assert cell.startswith(NOT_RECORDED), f"{row.where}: {cell!r}, the files record none"
        return
    assert len(values) == len(recorded), f"{row.where}: some files record it, some do not"
    if isinstance(values[0], float):
        quoted = _NUMBER.findall(cell)
        assert len(quoted) == len(values), f"{row.where}: {cell!r} vs {values}"
        assert all(_matches(q, v) for q, v in zip(quoted, values, strict=True)), (
            f"{row.where}: {cell!r} vs {values}"
        )
    else:
        assert sorted({part.strip() for part in cell.split(" / ")}) == sorted(set(values)), (
            f"{row.where}: {cell!r} vs {values}"
        )


def test_the_index_has_its_columns_and_every_suite() -> None:
    lines = INDEX.read_text().splitlines()
    header = lines[lines.index("## Suites") :]
    first = next(line for line in header if line.startswith("|"))
    assert tuple(c.strip() for c in first.strip("|").split("|")) == INDEX_COLUMNS
    assert sorted(row.label for row in _index_rows()) == sorted(INDEX_FIGURES)


@pytest.mark.parametrize("row", _index_rows(), ids=lambda row: row.label)
def test_index_row_is_its_results_files(row: Row) -> None:
    figure = INDEX_FIGURES[row.label]
    cells = dict(zip(INDEX_COLUMNS, row.cells, strict=True))
    assert _linked(cells["results"], RESULTS) == list(figure.files), row.where
    metas = [_meta(name) for name in figure.files]
    _check_column(row, cells["date"], [m[0] for m in metas])
    _check_column(row, cells["machine"], [m[1] for m in metas])
    _check_column(row, cells["load at start"], [m[2] for m in metas])
    _check(row, cells["headline"], figure)


def test_a_wrong_figure_fails() -> None:
    """The comparison is strict enough to catch the kind of slip it is for."""
    assert _matches("1.33", 1.3349) and not _matches("1.33", 1.3351)
    assert _matches("77", 77.1) and not _matches("35", 30.2)
    assert _quoted("a **1.33x** / **0.48 ms**, c = 16") == ["1.33", "0.48"]
