"""A decode step compiled whole by inductor against the packed runner with the C glue.

    python -m bench.studies.compiled_step [--out docs/benchmarks/compiled_step]
        [--rows 1,16] [--rounds 2] [--context 128] [--threads 2]

Issue 42's first item asks for the per-layer chain to run as few kernels as possible,
by ``torch.compile`` of the whole step (what vLLM-CPU does), by fused C ops, or both,
keeping what wins. This measures the options on SmolLM2-135M-Instruct in bf16, one
decode step at ``--rows`` sequences after a ``--context``-token prompt each:

- ``transformers eager``: transformers' own forward over a ``StaticCache``;
- ``inductor``: that forward through ``torch.compile(fullgraph=True, dynamic=False)``;
- ``inductor frozen``: the same with inductor's ``freezing`` (weights as constants,
  prepacked for oneDNN: what its mkldnn and C++ GEMM lowerings need; vLLM-CPU sets it
  with ``max_autotune``) and ``cpp_wrapper`` (no Python between the kernels);
- ``llmso``: the packed runner (``DecoderRunner``) with the C glue, as the engine runs it.

Each mode runs in a fresh process (inductor's settings are process-wide) with an empty
inductor cache (a cold compile, as on a fresh machine); per mode and row count the first
two steps (the compile, for the compiled modes) and the median of 40 after. Rounds
alternate the order of the modes. The static cache's attention spans the whole cache
(``context + 64`` positions, masked), the runner's only the positions written; at these
lengths that is a small part of a step. Writes ``results.json`` and
``results.md``, with the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cli import positive_ints
from bench.machine import study_footer, study_meta, write_study

MODES = ("transformers eager", "inductor", "inductor frozen", "llmso")
STEPS = 40


def _transformers_step(mode: str, rows: int, context: int) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM, StaticCache

    from backends.hf.loading.model_source import resolve_source
    from bench.suites import DEFAULT_SOURCE

    if mode == "inductor frozen":
        import torch._inductor.config as inductor

        inductor.freezing = True
        inductor.cpp_wrapper = True
    path = resolve_source(DEFAULT_SOURCE).path_or_id
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    model.train(False)
    cache = StaticCache(
        config=model.config,
        max_batch_size=rows,
        max_cache_len=context + STEPS + 24,
        device="cpu",
        dtype=torch.bfloat16,
    )
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40_000, (rows, context), generator=generator)
    token = torch.randint(100, 40_000, (rows, 1), generator=generator)
    with torch.inference_mode():
        model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(context))
        forward = model.forward
        if mode != "transformers eager":
            forward = torch.compile(model.forward, fullgraph=True, dynamic=False)

        def step(at: int) -> float:
            began = time.perf_counter()
            forward(input_ids=token, past_key_values=cache, cache_position=torch.tensor([at]))
            return time.perf_counter() - began

        return _times(step, context)


def _llmso_step(rows: int, context: int) -> dict[str, float]:
    import torch

    from backends.hf.loading.loader import load
    from backends.hf.model import glue
    from backends.hf.model.packed_runner import DecoderRunner
    from backends.hf.model.slot_attention import PrefillChunk
    from bench.suites import DEFAULT_SOURCE
    from config.schema import HFModelConfig

    kernels = glue.load()
    if isinstance(kernels, str):
        raise SystemExit(f"the C glue kernels are {kernels}")
    config = HFModelConfig(
        name="m", backend="hf", source=DEFAULT_SOURCE, dtype="bfloat16", device="cpu"
    )
    loaded = load(config)
    with torch.inference_mode():
        runner = DecoderRunner(
            loaded.model, max_slots=rows + 1, max_context=context + STEPS + 24, glue=kernels
        )
        tokens = tuple(range(100, 100 + context))
        chunks = [
            PrefillChunk(
                slot=i,
                tokens=tokens,
                start=0,
                want_logits=False,
                fixed=runner.fixed_prefill(context),
            )
            for i in range(rows)
        ]
        runner.forward([], [], chunks)

        def step(at: int) -> float:
            began = time.perf_counter()
            runner.forward([7] * rows, [at] * rows, [])
            return time.perf_counter() - began

        return _times(step, context)


def _times(step: Any, context: int) -> dict[str, float]:
    """The first two steps' seconds (a compile) and the median step's milliseconds."""
    first = step(context) + step(context + 1)
    samples = [step(context + 2 + k) for k in range(STEPS)]
    return {"first_two_s": round(first, 2), "step_ms": round(statistics.median(samples) * 1e3, 2)}


def one(mode: str, rows: int, context: int, threads: int) -> dict[str, float]:
    """One mode at one row count, in this process."""
    import torch

    torch.set_num_threads(threads)
    if mode == "llmso":
        return _llmso_step(rows, context)
    return _transformers_step(mode, rows, context)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for round_ in range(args.rounds):
        modes = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in modes:
            for rows in args.rows:
                command = [
                    sys.executable,
                    "-m",
                    "bench.studies.compiled_step",
                    "--one",
                    mode,
                    "--rows",
                    str(rows),
                    "--context",
                    str(args.context),
                    "--threads",
                    str(args.threads),
                ]
                with tempfile.TemporaryDirectory() as cache:  # a cold compile every time
                    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
                    done = subprocess.run(
                        command, capture_output=True, text=True, timeout=900, check=True, env=env
                    )
                result = json.loads(done.stdout.strip().splitlines()[-1])
                runs.append({"round": round_, "mode": mode, "rows": rows, **result})
                print(f"round {round_} {mode} {rows} rows: {result}", flush=True)
    return runs


def markdown(record: dict[str, Any]) -> str:
    rows = record["rows"]
    runs = record["runs"]

    def median(mode: str, n: int, key: str) -> float:
        return float(
            statistics.median(r[key] for r in runs if r["mode"] == mode and r["rows"] == n)
        )

    head = " | ".join(f"{n} row{'s' * (n > 1)}: step ms (/ llmso) | compile s" for n in rows)
    lines = [
        "# A decode step compiled whole by inductor vs the packed runner with the C glue",
        "",
        f"SmolLM2-135M-Instruct, bf16, context {record['context']}; median over rounds of "
        "each run's median step, and its first two steps (the compile, where one runs).",
        "",
        f"| mode | {head} |",
        "|---|" + "---|---|" * len(rows),
    ]
    for mode in MODES:
        cells = []
        for n in rows:
            ms, ours = median(mode, n, "step_ms"), median("llmso", n, "step_ms")
            cells += [f"{ms:.1f} ({ms / ours:.2f}x)", f"{median(mode, n, 'first_two_s'):.1f}"]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines + study_footer(record["meta"], record["threads"], record["rounds"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/compiled_step"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=positive_ints, default=(1, 16))
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", choices=MODES, help="run one mode here (internal)")
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one(args.one, args.rows[0], args.context, args.threads)))
        return 0
    meta = study_meta("bench.studies.compiled_step", argv or sys.argv[1:])
    runs = measure(args)
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    record = {
        "meta": meta,
        "threads": args.threads,
        "rows": list(args.rows),
        "context": args.context,
        "rounds": args.rounds,
        "runs": runs,
    }
    write_study(args.out, "results", record, markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
