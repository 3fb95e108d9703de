"""What the C glue kernels save: the packed runner's step with and without them.

    python -m bench.studies.glue [--out docs/benchmarks/glue] [--rounds 3]
        [--rows 1,4,16,64] [--prefill 32,128,512] [--settings none,int4] [--threads 2]
    python -m bench.studies.glue --profile [--rows 1,16] [--out docs/benchmarks/glue]
    python -m bench.studies.glue --attention [--out docs/benchmarks/glue]

SmolLM2-135M-Instruct loaded once in bf16; per round, for each weight setting, a runner
with the glue (``backends/hf/model/glue.py``: norms, residual add + norm, RoPE and
SiLU·up as one C call each) and one with the framework ops, alternating which goes first
from round to round. Each is timed on its decode step at 1/4/16/64 rows (median of 20,
``bench.studies.quant_accuracy.step_times``) and one prefill chunk of 32/128/512 tokens
(best of three); a third runner adds ``batch_invariant`` (the glue's per-row decode
attention). Writes ``results.json`` (every round) and ``results.md`` (medians over
rounds, and the glue's time over the framework ops'), with the load average at the start.

``--profile``: instead, ``torch.profiler`` over ten decode steps per setting, row count
and mode; writes ``profile.json`` and ``profile.md``: framework ops per step and their
self CPU time by kind, beside the step's unprofiled time (the C calls are invisible to
the profiler: they are in the gap between the two).

``--attention``: instead, one layer's decode attention per kernel at a few rows x span
shapes (``attention.json``, ``attention.md``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.cli import positive_ints
from bench.machine import study_footer, study_meta, write_study


def _time(runner: Any, rows: tuple[int, ...], prefill: tuple[int, ...]) -> dict[str, Any]:
    from bench.studies.quant_accuracy import step_times
    from bench.studies.quant_steps import prefill_ms

    slot = max(rows)
    return {
        "decode_ms": step_times(runner, rows),
        "prefill_ms": {str(n): prefill_ms(runner, n, slot) for n in prefill},
    }


def _setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The loaded model (bf16), the glue kernels, and the base config, or exit."""
    import torch

    from backends.hf.loading.loader import load
    from backends.hf.model import glue
    from bench.suites import DEFAULT_SOURCE
    from config.schema import HFModelConfig

    kernels = glue.load()
    if isinstance(kernels, str):
        raise SystemExit(f"the C glue kernels are {kernels}")
    torch.set_num_threads(args.threads)
    base = HFModelConfig(
        name="m", backend="hf", source=DEFAULT_SOURCE, dtype="bfloat16", device="cpu"
    )
    return load(base), kernels, base


# the framework ops; the C glue; the C glue with batch-invariant decode attention
MODES = ("framework ops", "C glue", "batch-invariant")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from backends.hf.loading.quantization import quant_plan
    from backends.hf.model.packed_runner import DecoderRunner

    loaded, kernels, base = _setup(args)
    runs = []
    with torch.inference_mode():
        for round_ in range(args.rounds):
            for setting in args.settings:
                plan = quant_plan(base.model_copy(update={"quantization": setting}))
                modes = MODES if round_ % 2 == 0 else MODES[::-1]
                for mode in modes:
                    runner = DecoderRunner(
                        loaded.model,
                        max_slots=max(args.rows) + 1,
                        max_context=max(args.prefill) + 128,
                        quantization=plan,
                        glue=None if mode == "framework ops" else kernels,
                        batch_invariant=mode == "batch-invariant",
                    )
                    result = _time(runner, args.rows, args.prefill)
                    del runner
                    runs.append({"round": round_, "setting": setting, "mode": mode, **result})
                    print(f"round {round_} {setting} {mode}: {result}", flush=True)
    return runs


SHAPES = ((1, 64), (1, 1024), (4, 256), (16, 128), (16, 512), (16, 1024), (64, 128))


def median_us(calls: Mapping[str, Callable[[], object]]) -> dict[str, float]:
    """Median µs per call of each, over 5 interleaved repeats of 20 calls."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(5):
        for name, call in calls.items():
            call()
            began = time.perf_counter()
            for _ in range(20):
                call()
            samples[name].append((time.perf_counter() - began) / 20 * 1e6)
    return {name: statistics.median(times) for name, times in samples.items()}


def attention_us(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One layer's decode attention at SmolLM2's heads, µs per call (median of 5
    interleaved repeats of 20 calls) for SDPA, the fp32 matmuls and the per-row kernel;
    the rows' lengths spread over the upper half of the span, one row at full span."""
    import torch

    from backends.hf.model.decode_attention import decode_matmul, decode_sdpa

    loaded, kernels, _ = _setup(args)
    cfg = loaded.model.config
    heads, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // heads
    gen = torch.Generator().manual_seed(0)
    out = []
    for rows, span in SHAPES:
        cache = [torch.randn(rows, kvh, 2 * span, hd, generator=gen).bfloat16() for _ in "kv"]
        k, v = (c[:, :, :span] for c in cache)
        q = torch.randn(rows, heads, hd, generator=gen).bfloat16()
        pos = torch.randint(span // 2, span, (rows,), generator=gen)
        pos[0] = span - 1
        allowed = torch.arange(span)[None, :] <= pos[:, None]
        mask = torch.zeros(rows, span).masked_fill_(~allowed, float("-inf"))
        sdpa_bias = mask.bfloat16()[:, None, None, :]
        matmul_bias = mask[:, None, None, :].expand(rows, kvh, 1, span).reshape(-1, 1, span)
        bounds = torch.stack((torch.zeros_like(pos), pos), dim=1)
        calls = {
            "sdpa": functools.partial(decode_sdpa, q, k, v, sdpa_bias, hd**-0.5),
            "matmul": functools.partial(decode_matmul, q, k, v, matmul_bias, hd**-0.5),
            "invariant": functools.partial(kernels.decode_attention, q, k, v, bounds, hd**-0.5),
        }
        with torch.inference_mode():
            entry: dict[str, Any] = {"rows": rows, "span": span, **median_us(calls)}
        out.append(entry)
        print(entry, flush=True)
    return out


def attention_markdown(record: dict[str, Any]) -> str:
    lines = [
        "# Decode attention kernels, one layer, µs per call",
        "",
        "SmolLM2's heads; median of 5 interleaved repeats of 20 calls. `invariant`: the "
        "C glue's per-row kernel (AVX512 where the CPU has it), the one `batch_invariant: "
        "true` uses and a candidate the runner times at load otherwise; it splits rows x kv "
        "heads over the torch threads from 512 keys a call, one thread below. SDPA and "
        "the matmuls run on the torch threads.",
        "",
        "| rows x span | sdpa | matmul | invariant | invariant / fastest of the others |",
        "|---|---|---|---|---|",
    ]
    for e in record["attention"]:
        best = min(e["sdpa"], e["matmul"])
        lines.append(
            f"| {e['rows']} x {e['span']} | {e['sdpa']:.0f} | {e['matmul']:.0f} | "
            f"{e['invariant']:.0f} | {e['invariant'] / best:.2f}x |"
        )
    lines += study_footer(record["meta"], record["threads"], None)
    return "\n".join(lines)


KINDS = (
    ("projections", ("linear_pointwise", "int4pack_mm", "int8pack_mm", "aten::mm", "addmm")),
    ("attention", ("attention", "bmm", "softmax")),
    ("cache writes", ("index_copy",)),
)


def _kind(name: str) -> str:
    return next((kind for kind, keys in KINDS if any(k in name for k in keys)), "other ops")


def profile_step(runner: Any, rows: int) -> dict[str, Any]:
    """Ops per decode step at ``rows`` rows and their self CPU ms per step, by kind."""
    from torch.profiler import ProfilerActivity, profile

    from bench.studies.quant_accuracy import step_times

    wall = step_times(runner, (rows,))[str(rows)]  # also fills the slots
    steps = 10
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for k in range(steps):
            runner.forward([7] * rows, [64 + k % 8] * rows, [])
    ms: dict[str, float] = {}
    calls = 0
    for event in prof.key_averages():
        kind = _kind(event.key)
        ms[kind] = ms.get(kind, 0.0) + event.self_cpu_time_total / 1e3 / steps
        calls += event.count
    return {"step_ms": wall, "ops_per_step": calls / steps, "self_cpu_ms": ms}


def profile_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from backends.hf.loading.quantization import quant_plan
    from backends.hf.model.packed_runner import DecoderRunner

    loaded, kernels, base = _setup(args)
    out = []
    with torch.inference_mode():
        for setting in args.settings:
            plan = quant_plan(base.model_copy(update={"quantization": setting}))
            for with_glue in (False, True):
                runner = DecoderRunner(
                    loaded.model,
                    max_slots=max(args.rows) + 1,
                    max_context=256,
                    quantization=plan,
                    glue=kernels if with_glue else None,
                )
                for rows in args.rows:
                    entry = {"setting": setting, "glue": with_glue, "rows": rows}
                    out.append(entry | profile_step(runner, rows))
                    print(out[-1], flush=True)
    return out


def profile_markdown(record: dict[str, Any]) -> str:
    kinds = [kind for kind, _ in KINDS] + ["other ops"]
    lines = [
        "# One decode step by kind of framework op, with and without the C glue",
        "",
        "Per step: the unprofiled step time (median of 20), the framework ops the profiler "
        "saw, and their self CPU ms by kind (10 profiled steps; the profiler adds its own "
        "cost per op). The C glue calls are not framework ops.",
        "",
        "| weights | rows | glue | step ms | ops | " + " | ".join(kinds) + " |",
        "|---|---|---|---|---|" + "---|" * len(kinds),
    ]
    for e in record["profiles"]:
        cells = [e["setting"], str(e["rows"]), "C" if e["glue"] else "-"]
        cells += [f"{e['step_ms']:.1f}", f"{e['ops_per_step']:.0f}"]
        cells += [f"{e['self_cpu_ms'].get(kind, 0.0):.2f}" for kind in kinds]
        lines.append("| " + " | ".join(cells) + " |")
    lines += study_footer(record["meta"], record["threads"], None)
    return "\n".join(lines)


def _median(runs: list[dict[str, Any]], setting: str, mode: str, kind: str, key: str) -> float:
    picked = [r[kind][key] for r in runs if r["setting"] == setting and r["mode"] == mode]
    return float(statistics.median(picked))


def markdown(record: dict[str, Any]) -> str:
    runs, rows, prefill = record["runs"], record["rows"], record["prefill"]
    head = [f"decode {n} rows" for n in rows] + [f"prefill {n} tokens" for n in prefill]
    lines = [
        "# The C glue kernels: the packed runner's step with and without them",
        "",
        "Median ms over rounds (in brackets: over the framework ops' median). "
        "`batch-invariant`: the C glue plus `batch_invariant: true` (decode attention by "
        "the glue's per-row kernel instead of the fastest one timed at load).",
        "",
        "| weights | mode | " + " | ".join(head) + " |",
        "|---|---|" + "---|" * len(head),
    ]
    for setting in record["settings"]:
        for mode in MODES:
            cells = [setting, mode]
            for kind, keys in (("decode_ms", rows), ("prefill_ms", prefill)):
                for n in keys:
                    value = _median(runs, setting, mode, kind, str(n))
                    base = _median(runs, setting, MODES[0], kind, str(n))
                    ratio = "" if mode == MODES[0] else f" ({value / base:.2f}x)"
                    cells.append(f"{value:.1f}{ratio}")
            lines.append("| " + " | ".join(cells) + " |")
    lines += study_footer(record["meta"], record["threads"], record["rounds"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/glue"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=positive_ints, default=(1, 4, 16, 64))
    parser.add_argument("--prefill", type=positive_ints, default=(32, 128, 512))
    parser.add_argument("--settings", type=lambda s: s.split(","), default=["none", "int4"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="profile instead of timing")
    parser.add_argument(
        "--attention", action="store_true", help="time the decode attention kernels instead"
    )
    args = parser.parse_args(argv)
    meta = study_meta("bench.studies.glue", argv or sys.argv[1:])
    body: dict[str, Any]
    if args.attention:
        stem, render, body = "attention", attention_markdown, {"attention": attention_us(args)}
    elif args.profile:
        stem, render, body = "profile", profile_markdown, {"profiles": profile_all(args)}
    else:
        stem, render = "results", markdown
        body = {
            "rows": list(args.rows),
            "prefill": list(args.prefill),
            "settings": args.settings,
            "rounds": args.rounds,
            "runs": measure(args),
        }
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    record = {"meta": meta, "threads": args.threads, **body}
    write_study(args.out, stem, record, render(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
