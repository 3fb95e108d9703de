"""What the C glue kernels save: the packed runner's step with and without them.

    python -m bench.studies.glue [--out docs/benchmarks/glue] [--rounds 3]
        [--rows 1,4,16,64] [--prefill 32,128,512] [--settings none,int4] [--threads 2]
    python -m bench.studies.glue --profile [--rows 1,16] [--out docs/benchmarks/glue]

SmolLM2-135M-Instruct loaded once in bf16; per round, for each weight setting, a runner
with the glue (``backends/hf/model/glue.py``: norms, residual add + norm, RoPE and
SiLU·up as one C call each) and one with the framework ops, alternating which goes first
from round to round. Each is timed on its decode step at 1/4/16/64 rows (median of 20,
``bench.studies.quant_accuracy.step_times``) and one prefill chunk of 32/128/512 tokens
(best of three). Writes ``results.json`` (every round) and ``results.md`` (medians over
rounds, and the glue's time over the framework ops'), with the load average at the start.

``--profile``: instead, ``torch.profiler`` over ten decode steps per setting, row count
and mode; writes ``profile.json`` and ``profile.md``: framework ops per step and their
self CPU time by kind, beside the step's unprofiled time (the C calls are invisible to
the profiler: they are in the gap between the two).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
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
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for with_glue in order:
                    runner = DecoderRunner(
                        loaded.model,
                        max_slots=max(args.rows) + 1,
                        max_context=max(args.prefill) + 128,
                        quantization=plan,
                        glue=kernels if with_glue else None,
                    )
                    result = _time(runner, args.rows, args.prefill)
                    del runner
                    runs.append({"round": round_, "setting": setting, "glue": with_glue, **result})
                    print(f"round {round_} {setting} glue={with_glue}: {result}", flush=True)
    return runs


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


def _median(runs: list[dict[str, Any]], setting: str, glue: bool, kind: str, key: str) -> float:
    picked = [r[kind][key] for r in runs if r["setting"] == setting and r["glue"] == glue]
    return float(statistics.median(picked))


def markdown(record: dict[str, Any]) -> str:
    runs, rows, prefill = record["runs"], record["rows"], record["prefill"]
    head = [f"decode {n} rows" for n in rows] + [f"prefill {n} tokens" for n in prefill]
    lines = [
        "# The C glue kernels: the packed runner's step with and without them",
        "",
        "Median ms over rounds; the glue rows add, in brackets, their time over the "
        "framework ops' time.",
        "",
        "| weights | element-wise glue | " + " | ".join(head) + " |",
        "|---|---|" + "---|" * len(head),
    ]
    for setting in record["settings"]:
        for with_glue in (False, True):
            cells = [setting, "C glue" if with_glue else "framework ops"]
            for kind, keys in (("decode_ms", rows), ("prefill_ms", prefill)):
                for n in keys:
                    value = _median(runs, setting, with_glue, kind, str(n))
                    base = _median(runs, setting, False, kind, str(n))
                    cells.append(f"{value:.1f}" + (f" ({value / base:.2f}x)" if with_glue else ""))
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
    args = parser.parse_args(argv)
    meta = study_meta("bench.studies.glue", argv or sys.argv[1:])
    if args.profile:
        profiles = profile_all(args)
        meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        record = {"meta": meta, "threads": args.threads, "profiles": profiles}
        write_study(args.out, "profile", record, profile_markdown(record))
        return 0
    runs = measure(args)
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    record = {
        "meta": meta,
        "rows": list(args.rows),
        "prefill": list(args.prefill),
        "settings": args.settings,
        "threads": args.threads,
        "rounds": args.rounds,
        "runs": runs,
    }
    write_study(args.out, "results", record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
