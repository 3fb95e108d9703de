"""Decode-step times before and after a phase of one-thread steps (docs/hf_profile.md,
"Thread switching").

Loads the model into a ``DecoderRunner`` on a worker thread (as the hf backend does), then
on a second thread (the engine's) times phases of decode steps: ``rows`` rows on 2
threads, ``small`` rows on 1 thread, ``rows`` rows on 2 threads again. Per phase it prints
the median step time and the CPU each OS thread of the process used, so a worker that
spins (or a pool that was left behind) shows up. Run it under ``/work/bin/quiet``::

    python -m bench.thread_switch --model-path PATH [--compile-attention] [--rows 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from backends.hf.loading.load_thread import call_in_own_thread
from backends.hf.loading.loader import load
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from backends.hf.model.step_threads import StepThreads
from config.schema import HFModelConfig

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds per OS thread of this process, keyed ``tid:name``."""
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{task.name}:{name}"] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def _cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(v - before.get(k, 0.0), 2) for k, v in after.items() if v > before.get(k, 0)}


class Phases:
    """Decode steps over slots ``0..rows-1`` prefilled with ``context`` tokens each.
    Owner: the thread that calls ``run`` (it owns the runner's cache)."""

    def __init__(self, runner: DecoderRunner, rows: int, context: int) -> None:
        self.runner = runner
        chunks = [
            PrefillChunk(
                slot=s, tokens=tuple(range(300 + s, 300 + s + context)), start=0, want_logits=False
            )
            for s in range(rows)
        ]
        runner.forward([], [], chunks)
        self.position = context
        self.rows = rows

    def step(self, rows: int) -> float:
        began = time.perf_counter()
        self.runner.forward([400 + r for r in range(rows)], [self.position] * rows, [])
        return time.perf_counter() - began

    def phase(self, label: str, rows: int, threads: int, steps: int, quiet: bool = False) -> None:
        torch.set_num_threads(threads)
        before, wall = thread_cpu(), time.perf_counter()
        times = [self.step(rows) for _ in range(steps)]
        wall = time.perf_counter() - wall
        cpu = _cpu_delta(before, thread_cpu())
        if quiet:
            return
        print(
            f"{label:<28} rows={rows:<3} threads={threads} "
            f"median {statistics.median(times) * 1e3:7.2f} ms  min {min(times) * 1e3:7.2f} "
            f"wall {wall:5.2f}s cpu/thread {cpu}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--compile-attention", action="store_true")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--small", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--context", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--attention", choices=("sdpa", "matmul", "compiled"), default=None)
    parser.add_argument("--flips", type=int, default=0, help="1/2-thread alternations per round")
    args = parser.parse_args()
    if args.small > args.rows:
        parser.error("--small must not exceed --rows (only --rows slots are prefilled)")
    config = HFModelConfig(
        name="m", backend="hf", source=args.model_path, dtype="bfloat16", device="cpu", threads=2
    )

    def build() -> DecoderRunner:
        torch.set_num_threads(2)
        loaded = load(config)
        with torch.inference_mode():
            return DecoderRunner(
                loaded.model,
                max_slots=args.rows + 1,
                max_context=512,
                compile_attention=args.compile_attention,
                # as the engine: the phases' counts below are what it sets for these rows
                step_threads=StepThreads(2),
            )

    runner: DecoderRunner = call_in_own_thread(build, "build")
    if args.attention:  # instead of what load timed fastest
        runner.attention.decode_impl = runner.attention.decode_impl_long = args.attention
    print(
        f"decode attention: {runner.attention.decode_impl} / {runner.attention.decode_impl_long}",
        flush=True,
    )
    print(f"timed at load (s per 3 calls): {runner.attention.decode_timings}", flush=True)

    def engine() -> None:
        with torch.inference_mode():
            torch.set_num_threads(2)
            phases = Phases(runner, args.rows, args.context)
            phases.phase("warm", args.rows, 2, 5)
            for r in range(args.rounds):
                phases.phase(f"round {r}: big, 2 threads", args.rows, 2, args.steps)
                phases.phase(f"round {r}: small, 1 thread", args.small, 1, args.steps)
                for _ in range(args.flips):
                    phases.phase("", args.small, 1, 1, quiet=True)
                    phases.phase("", args.rows, 2, 1, quiet=True)
                phases.phase(f"round {r}: big, 2 again", args.rows, 2, args.steps)

    call_in_own_thread(engine, "engine")


if __name__ == "__main__":
    main()
