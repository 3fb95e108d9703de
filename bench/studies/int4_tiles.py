"""int4 on AMX tiles against PyTorch's int4 kernel and bf16: per layer and per step.

    python -m bench.studies.int4_tiles [--out docs/benchmarks/int4_tiles] [--rounds 3]
        [--rows 1,4,16,64] [--prompts 128,256,512] [--prefill 128,512] [--threads 2]

Layer: SmolLM2-135M's four projection shapes (Q/K/V 960x576, O 576x576, gate/up
3072x576, down 576x1536; random weights, seeded) as the runner builds them, µs for all
four at 1/4/16/64 decode rows, and for a prompt's rows at ``--prompts`` (bf16 in its
fixed-size calls, each int4 on its weights unpacked per call, and the tiles for every
row: where the tiles' ``TILES_PROMPT_TOKENS`` comes from), median of 5 interleaved
repeats of 20 calls, the weights warm in cache. Step: the packaged SmolLM2 in bf16, a
``DecoderRunner`` per kind (bf16, int4 on PyTorch's kernel, int4 on the tiles), its
decode step at the same rows (median of 20) and one prefill per ``--prefill`` length
(best of three), alternating the order from round to round. Writes
``results.json`` (every round) and ``results.md`` (medians), with the load average at
the start. Needs a CPU with AMX (``linears.Int4Tiles``)."""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cli import positive_ints
from bench.machine import study_footer, study_meta, write_study
from bench.studies.glue import median_us

SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
KINDS = ("bf16", "int4 PyTorch kernel", "int4 tiles")


def _linears(kind: str, weights: list[Any]) -> list[Any]:
    from backends.hf.model.linears import Int4, Int4Tiles, make_linear

    if kind == "bf16":
        return [make_linear(w, None, "none", prompt_rows=True) for w in weights]
    if kind == "int4 PyTorch kernel":
        return [Int4.of(w, None, 32, prompt_rows=True) for w in weights]
    tiles = [Int4Tiles.of(w, None, 32, prompt_rows=True) for w in weights]
    if any(t is None for t in tiles):
        raise SystemExit("int4 tiles need a CPU with AMX and the C kernels (make install)")
    return tiles


def _each(calls: list[Any], xs: list[Any], fixed_from: int | None) -> None:
    """Each projection on its rows (``fixed_from``: as the runner passes it; None where
    the calls take no such argument)."""
    for call, x in zip(calls, xs, strict=True):
        if fixed_from is None:
            call(x)
        else:
            call(x, fixed_from=fixed_from)


def layer_us(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    """µs for the four projections: per kind at decode rows; for a prompt's rows (bf16's
    fixed-size calls, each int4 on its weights unpacked, and the tiles for every row)."""
    import torch

    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, k, generator=gen) * 0.05).bfloat16() for n, k in SHAPES]
    linears = {kind: _linears(kind, weights) for kind in KINDS}
    decode: list[dict[str, Any]] = []
    prompts: list[dict[str, Any]] = []
    with torch.inference_mode():
        for rows, prompt in [(n, False) for n in args.rows] + [(n, True) for n in args.prompts]:
            xs = [torch.randn(rows, k, generator=gen).bfloat16() for _, k in SHAPES]
            fixed = 0 if prompt else None
            calls: dict[str, Callable[[], None]] = {
                kind: functools.partial(_each, layer, xs, fixed) for kind, layer in linears.items()
            }
            if prompt:  # the tiles for a prompt's rows too, no unpacking
                tiles = [linear._tiles for linear in linears["int4 tiles"]]
                calls["int4 tiles, every row"] = functools.partial(_each, tiles, xs, None)
            entry: dict[str, Any] = {"rows": rows, **median_us(calls)}
            (prompts if prompt else decode).append(entry)
            print(entry, flush=True)
    return {"decode": decode, "prompts": prompts}


def step_ms(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per round and kind, the runner's decode step and one prompt's prefill, ms."""
    import torch

    from backends.hf.loading.quantization import NONE, uniform
    from backends.hf.model import linears
    from backends.hf.model.packed_runner import DecoderRunner
    from bench.studies.glue import _setup, _time

    loaded, kernels, _ = _setup(args)
    tiles_of = linears.Int4Tiles.of
    runs = []
    with torch.inference_mode():
        for round_ in range(args.rounds):
            for kind in KINDS if round_ % 2 == 0 else KINDS[::-1]:
                # PyTorch's kernel: as on a CPU without AMX, where int4 takes it
                pytorch = kind == "int4 PyTorch kernel"
                linears.Int4Tiles.of = (lambda *_, **__: None) if pytorch else tiles_of  # type: ignore[assignment,method-assign]
                try:
                    runner = DecoderRunner(
                        loaded.model,
                        max_slots=max(args.rows) + 1,
                        max_context=max(args.prefill) + 128,
                        quantization=NONE if kind == "bf16" else uniform("int4", 32),
                        glue=kernels,
                    )
                finally:
                    linears.Int4Tiles.of = tiles_of  # type: ignore[method-assign]
                result = _time(runner, args.rows, args.prefill)
                del runner
                runs.append({"round": round_, "kind": kind, **result})
                print(f"round {round_} {kind}: {result}", flush=True)
    return runs


def _layer_table(entries: list[dict[str, Any]], kinds: tuple[str, ...]) -> list[str]:
    lines = ["| rows | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for e in entries:
        cells = [f"{e[kinds[0]]:.0f}"]
        cells += [f"{e[k]:.0f} ({e[k] / e[kinds[0]]:.2f}x)" for k in kinds[1:]]
        lines.append(f"| {e['rows']} | " + " | ".join(cells) + " |")
    return lines


def markdown(record: dict[str, Any]) -> str:
    rows, prefill = record["rows"], record["prefill"]
    lines = [
        "# int4 on AMX tiles against PyTorch's int4 kernel and bf16",
        "",
        "## One layer's four projections, µs (SmolLM2's shapes, random weights)",
        "",
        "Median of 5 interleaved repeats of 20 calls, weights warm in cache; in brackets: "
        "over bf16. Decode rows:",
        "",
        *_layer_table(record["layer"]["decode"], KINDS),
        "",
        "A prompt's rows (`fixed_from=0`): bf16 in its fixed-size calls, each int4 on its "
        "weights unpacked to bf16 per call, beside the tiles for every row:",
        "",
        *_layer_table(record["layer"]["prompts"], (*KINDS, "int4 tiles, every row")),
    ]
    head = [f"decode {n} rows" for n in rows] + [f"prefill {n} tokens" for n in prefill]
    lines += [
        "",
        "## The packaged SmolLM2's runner, ms",
        "",
        "Decode step: median of 20; prefill: one prompt, best of three (int4 tiles: "
        f"unpacked from {record['tiles_prompt_tokens']} tokens); median over rounds, in "
        "brackets over bf16's.",
        "",
        "| weights | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(head),
    ]
    keys = [("decode_ms", n) for n in rows] + [("prefill_ms", n) for n in prefill]
    for kind in KINDS:
        cells = []
        for key, n in keys:
            value = _median(record["runs"], kind, key, str(n))
            base = _median(record["runs"], KINDS[0], key, str(n))
            cells.append(f"{value:.1f}" + ("" if kind == KINDS[0] else f" ({value / base:.2f}x)"))
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += study_footer(record["meta"], record["threads"], record["rounds"])
    return "\n".join(lines)


def _median(runs: list[dict[str, Any]], kind: str, key: str, n: str) -> float:
    return float(statistics.median(r[key][n] for r in runs if r["kind"] == kind))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/int4_tiles"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=positive_ints, default=(1, 4, 16, 64))
    parser.add_argument("--prompts", type=positive_ints, default=(128, 256, 512))
    parser.add_argument("--prefill", type=positive_ints, default=(128, 512))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    from backends.hf.model.linears import TILES_PROMPT_TOKENS

    meta = study_meta("bench.studies.int4_tiles", argv or sys.argv[1:])
    record: dict[str, Any] = {
        "meta": meta,
        "threads": args.threads,
        "rows": list(args.rows),
        "prefill": list(args.prefill),
        "tiles_prompt_tokens": TILES_PROMPT_TOKENS,
        "rounds": args.rounds,
        "layer": layer_us(args),
        "runs": step_ms(args),
    }
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_study(args.out, "results", record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
