"""What batch invariance costs on an AMX CPU: the packed runner's step three ways.

    python -m bench.studies.row_blocks [--out docs/benchmarks/row_blocks] [--rounds 3]
        [--rows 1,4,16,32,64] [--prefill 32,81,100,153,262,512] [--threads 2]

SmolLM2-135M-Instruct in bf16, loaded in a fresh process per mode and round (the modes
rotate from round to round, so all see the same neighbours), its decode step at 1/4/16/32/64
rows (median of 20, ``bench.studies.quant_accuracy.step_times``) and one prefill chunk of
32, 81, 100, 153, 262 and 512 tokens (best of three; 81, 153 and 262 are lengths of the
built-in benchmark prompts):

- ``row-blocks``: as shipped: each bf16 projection splits decode rows wider than its
  probed invariant width into calls of that many rows (``backends/hf/model/row_blocks.py``:
  32 on AMX, no split elsewhere), and a prompt of ``Dense.prompt_tokens`` or more (33
  tokens on AMX) into calls of its probed fixed sizes (multiples of 16 up to 512 on AMX,
  from 48), the last one padded;
- ``64-row steps``: the same with the fixed sizes probed at multiples of 64 only (as
  shipped before: more zero rows padding a prompt's last call);
- ``32-row prefill``: the same, with every prompt split like decode rows (as shipped
  before the fixed-size calls);
- ``whole``: every projection in one call (not batch-invariant on AMX);
- ``capped``: one call, with oneDNN capped below AMX (``ONEDNN_MAX_CPU_ISA=
  AVX512_CORE_BF16``), what ``llmso serve`` set before the row blocks.

Writes ``results.json`` (every round) and ``results.md`` (medians over rounds, and each
mode's time over ``row-blocks``'), with the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.machine import study_footer, study_meta, write_study

MODES = ("row-blocks", "64-row steps", "32-row prefill", "whole", "capped")
CAP = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}


def _one(mode: str, rows: list[int], prefill: list[int], threads: int) -> dict[str, Any]:
    """In this process (a fresh one per mode): load, build the runner, time it."""
    import torch

    from backends.hf.loading.loader import load
    from backends.hf.model import linears, row_blocks
    from backends.hf.model.packed_runner import DecoderRunner
    from bench.studies.quant_accuracy import step_times
    from bench.studies.quant_steps import prefill_ms
    from bench.suites import DEFAULT_SOURCE
    from config.schema import HFModelConfig

    torch.set_num_threads(threads)
    if mode == "32-row prefill":
        setattr(row_blocks, "FIXED_WIDTHS", ())  # noqa: B010
    elif mode == "64-row steps":
        setattr(row_blocks, "FIXED_STEP", 64)  # noqa: B010
    elif mode != "row-blocks":
        setattr(linears, "_row_blocks", lambda *probe_args: (None, ()))  # noqa: B010
    config = HFModelConfig(
        name="m", backend="hf", source=DEFAULT_SOURCE, dtype="bfloat16", device="cpu"
    )
    loaded = load(config)
    slots = max(rows) + 1
    with torch.inference_mode():
        runner = DecoderRunner(loaded.model, max_slots=slots, max_context=max(prefill) + 128)
        blocks = sorted(
            {f"{layer.qkv.row_block} / {layer.qkv.prefill_sizes}" for layer in runner.layers}  # type: ignore[attr-defined]
        )
        decode = step_times(runner, tuple(rows))
        chunks = {str(n): prefill_ms(runner, n, slots - 1) for n in prefill}
    return {"decode_ms": decode, "prefill_ms": chunks, "row_block": blocks}


def _child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if mode == "capped":
        env.update(CAP)
    command = [sys.executable, "-m", "bench.studies.row_blocks", "--child", mode]
    command += ["--rows", args.rows, "--prefill", args.prefill, "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], mode: str, kind: str, key: str) -> float:
    return float(statistics.median(r[kind][key] for r in runs if r["mode"] == mode))


def markdown(record: dict[str, Any]) -> str:
    runs, rows, prefill = record["runs"], record["rows"], record["prefill"]
    head = [f"decode {n} rows" for n in rows] + [f"prefill {n} tokens" for n in prefill]
    lines = [
        "# Batch invariance on this CPU: row blocks vs one call vs oneDNN capped",
        "",
        "Median ms over rounds (in brackets: over `row-blocks`' median).",
        "",
        "| mode | rows per call (decode / prompt) | " + " | ".join(head) + " |",
        "|---|---|" + "---|" * len(head),
    ]
    for mode in MODES:
        cells = [mode, ", ".join(next(r for r in runs if r["mode"] == mode)["row_block"])]
        for kind, keys in (("decode_ms", rows), ("prefill_ms", prefill)):
            for n in keys:
                value = _median(runs, mode, kind, str(n))
                base = _median(runs, "row-blocks", kind, str(n))
                cells.append(f"{value:.1f} ({value / base:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    lines += study_footer(record["meta"], record["threads"], record["rounds"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/row_blocks"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", default="1,4,16,32,64")
    parser.add_argument("--prefill", default="32,81,100,153,262,512")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rows = [int(n) for n in args.rows.split(",")]
    prefill = [int(n) for n in args.prefill.split(",")]
    if args.child:
        print(json.dumps(_one(args.child, rows, prefill, args.threads)))
        return 0
    meta = study_meta("bench.studies.row_blocks", argv or sys.argv[1:])
    runs = []
    for round_ in range(args.rounds):
        for i in range(len(MODES)):
            mode = MODES[(i + round_) % len(MODES)]
            result = _child(mode, args)
            runs.append({"mode": mode, "round": round_, **result})
            print(f"round {round_} {mode}: {result['decode_ms']} {result['prefill_ms']}")
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    record = {"meta": meta, "rows": rows, "prefill": prefill, "threads": args.threads}
    record |= {"rounds": args.rounds, "runs": runs}
    write_study(args.out, "results", record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
