"""``make bench-quant-steps``: where a quantized step's time goes, in process.

    python -m bench.studies.quant_steps --out docs/benchmarks/quant_shapes/steps
        (--model <folder> | --shape llama-3.2-1b --tokenizer-from <SmolLM2 folder>)
        [--models-dir .models/shaped] [--settings none,int4] [--rows 1,4,16,64]
        [--prefill 128,512]

Per weight setting, on one loaded model (no server): the median time of a decode step
with 1/4/16/64 rows at context ~64 (``bench.studies.quant_accuracy.step_times``), and the best of
three prefills of one 128- and one 512-token chunk; then the multiply-accumulates per
second each implies (parameters x rows / step time). A decode step at one row is bound
by the bytes it reads; at sixteen rows on two cores it is bound by arithmetic, which a
weight-only kernel does not reduce: it shows here as the quantized step catching up
with, then passing, bf16's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from backends.hf.loading.loader import load
from backends.hf.loading.quantization import quant_plan
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from bench.cli import positive_ints
from bench.machine import machine_info
from bench.studies.quant_accuracy import step_times
from bench.studies.shapes import SHAPES, write_shaped
from config.schema import HFModelConfig


def prefill_ms(runner: DecoderRunner, tokens: int, slot: int) -> float:
    """Best of three: one prefill chunk of ``tokens`` tokens into ``slot`` (a whole
    prompt: in fixed-size calls where the runner takes it so)."""
    chunk = PrefillChunk(
        slot=slot,
        tokens=tuple(range(200, 200 + tokens)),
        start=0,
        want_logits=True,
        fixed=runner.fixed_prefill(tokens),  # as the engine's scheduler asks
    )
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        runner.forward([], [], [chunk])
        samples.append(time.perf_counter() - start)
    return min(samples) * 1e3


def measure(args: argparse.Namespace, model: str) -> list[dict[str, Any]]:
    base = HFModelConfig(name="m", backend="hf", source=model, dtype="bfloat16", device="cpu")
    loaded = load(base)
    params = sum(p.numel() for p in loaded.model.parameters())
    slots = max(args.rows) + 1
    rows = []
    with torch.inference_mode():
        for setting in args.settings:
            config = base.model_copy(update={"quantization": setting})
            runner = DecoderRunner(
                loaded.model,
                max_slots=slots,
                max_context=max(args.prefill) + 128,
                quantization=quant_plan(config),
            )
            decode = step_times(runner, args.rows)
            prefill = {str(n): prefill_ms(runner, n, slots - 1) for n in args.prefill}
            rows.append(
                {
                    "setting": setting,
                    "weights_mb": runner.weight_bytes / 1e6,
                    "decode_ms": decode,
                    "prefill_ms": prefill,
                    "decode_gmac_per_s": {
                        k: params * int(k) / (v / 1e3) / 1e9 for k, v in decode.items()
                    },
                }
            )
            del runner
    return rows


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    first = rows[0]
    decode, prefill = list(first["decode_ms"]), list(first["prefill_ms"])
    head = ["setting", "weights", *(f"decode {n} rows" for n in decode)]
    head += [f"prefill {n} tokens" for n in prefill]
    lines = [
        f"# Step times in process: {meta['model']}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [row["setting"], f"{row['weights_mb']:.0f} MB"]
        cells += [
            f"{row['decode_ms'][n]:.1f} ms ({row['decode_gmac_per_s'][n]:.0f} GMAC/s)"
            for n in decode
        ]
        cells += [f"{row['prefill_ms'][n]:.0f} ms" for n in prefill]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Command: `{meta['command']}`; {meta['machine']['cpu_model']}, "
        f"{meta['machine']['cpus_usable']} CPUs, torch threads {meta['threads']}, "
        f"{meta['started']}. GMAC/s: all parameters x rows / decode step time.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a local model folder")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a shaped model instead")
    parser.add_argument("--tokenizer-from", help="with --shape: the packaged SmolLM2 folder")
    parser.add_argument("--models-dir", type=Path, default=Path(".models/shaped"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--settings", type=lambda t: tuple(t.split(",")), default=("none", "int4"))
    parser.add_argument("--rows", type=positive_ints, default=(1, 4, 16, 64))
    parser.add_argument("--prefill", type=positive_ints, default=(128, 512))
    args = parser.parse_args(argv)
    if (args.model is None) == (args.shape is None) or (args.shape and not args.tokenizer_from):
        parser.error("give --model, or --shape with --tokenizer-from")
    model = args.model
    if args.shape:
        args.models_dir.mkdir(parents=True, exist_ok=True)
        shape = SHAPES[args.shape]
        model = str(write_shaped(shape, args.models_dir / shape.name, Path(args.tokenizer_from)))
    meta = {
        "command": " ".join(["python -m bench.studies.quant_steps", *sys.argv[1:]]),
        "model": args.shape or model,
        "machine": machine_info(),
        "threads": torch.get_num_threads(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rows = measure(args, model)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n"
    )
    (args.out / "README.md").write_text(markdown(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
