"""Fair share between client keys: key b's TTFT while key a keeps 16 streams in flight.

    python -m bench.studies.fairness [--out DIR] [--baseline REF] [--rounds 2]
        [--probes 30] [--load-streams 16] [--max-num-seqs N] [--threads N] [--name NAME]

Starts ``llmso serve`` with ``config/default.yaml`` as shipped (SmolLM2-135M-Instruct in
the hf backend; ``--max-num-seqs`` and ``--threads`` override its engine's) plus two
client keys of the same priority and weight, ``a`` and ``b``, and measures b's time to
the first streamed token (``bench.studies.priority.ttft``) in two phases:

0. a warm-up (not measured): both phases' batch shapes once;
1. ``idle``: b sends one short streamed request a second (``--probes`` of them), a idle;
2. ``busy``: a keeps ``--load-streams`` streams of 64 tokens in flight (a closed loop),
   b sends the same probes, one a second.

With ``--baseline REF`` the same server runs from REF's tree too (a temporary ``git
worktree``, removed at the end), interleaved round by round (REF, this tree, REF, ...),
so both see the same neighbours. Per tree, phase and round it keeps every probe's TTFT;
the table pools the rounds: p50, p95 and busy p95 / idle p95 (the issue asks for at most
1.5), beside key a's streamed content chunks per second (about a token each) while b
probes: what b's turns cost a.
Writes ``NAME.json`` and ``NAME.md`` into ``--out``, with the load average at the
start. A measurement, not a test: on a shared CPU box every number moves with the
neighbours' load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.machine import study_meta
from bench.studies.priority import MODEL, gateway, summary, ttft

KEY_A = "bench-fair-key-a-0001"
KEY_B = "bench-fair-key-b-0001"
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "default.yaml"
LOAD_TOKENS = 64
PROBE_TOKENS = 4


def config(max_num_seqs: int | None, threads: int | None) -> dict[str, Any]:
    """The shipped default config, two keys of equal priority and weight added (and the
    chat model's ``max_num_seqs`` and ``threads`` when given)."""
    shipped: dict[str, Any] = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for model in shipped["models"]:
        if model["name"] == MODEL:
            if max_num_seqs is not None:
                model["max_num_seqs"] = max_num_seqs
            if threads is not None:
                model["threads"] = threads
    shipped["auth"] = {
        "required": True,
        "keys": [{"name": "a", "key": KEY_A}, {"name": "b", "key": KEY_B}],
    }
    return shipped


@contextlib.asynccontextmanager
async def load(client: httpx.AsyncClient, streams: int) -> AsyncIterator[list[float]]:
    """Key a keeps ``streams`` requests in flight until the block ends; yields the list
    of the times its content chunks arrive, filled as they do."""
    stop = asyncio.Event()
    chunks: list[float] = []

    async def loop(worker: int) -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                text = f"Write a long story about the sea ({worker})."
                await ttft(client, KEY_A, LOAD_TOKENS, text, chunks=chunks)

    tasks = [asyncio.create_task(loop(i)) for i in range(streams)]
    await asyncio.sleep(5.0)  # every stream started, and the engine at its pace
    try:
        yield chunks
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def chunks_per_s(chunks: list[float], began: float, until: float) -> float:
    """Key a's content chunks per second (about a token each) from ``began`` to ``until``."""
    done = sum(1 for moment in chunks if began <= moment <= until)
    return round(done / (until - began), 1)


async def probes(client: httpx.AsyncClient, count: int) -> list[float]:
    """Key b's requests, one a second whatever the answers take (an open loop)."""
    tasks = []
    for index in range(count):
        text = f"Say one word, please ({index})."
        tasks.append(asyncio.create_task(ttft(client, KEY_B, PROBE_TOKENS, text)))
        await asyncio.sleep(1.0)
    return [value for value in await asyncio.gather(*tasks) if value is not None]


async def measure(url: str, count: int, streams: int) -> dict[str, list[float]]:
    limits = httpx.Limits(max_connections=streams + count + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        # Warm-up, not measured: the CPU kernels of each new batch shape are built on
        # first use (seconds on a busy box), so every shape of both phases is seen first.
        await probes(client, 3)
        async with load(client, streams):
            await probes(client, 10)
        idle = await probes(client, count)
        async with load(client, streams) as chunks:
            began = time.perf_counter()
            busy = await probes(client, count)
            a_rate = chunks_per_s(chunks, began, time.perf_counter())
    return {"idle": idle, "busy": busy, "a_chunks_per_s": [a_rate]}


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A temporary git worktree of ``ref`` (detached), removed at the end."""
    repo = DEFAULT_CONFIG.parents[1]
    with tempfile.TemporaryDirectory(prefix="llmso-fair-base-") as tmp:
        path = Path(tmp) / "tree"
        git = ["git", "-C", str(repo), "worktree"]
        subprocess.run([*git, "add", "--detach", str(path), ref], check=True)
        try:
            yield path
        finally:
            subprocess.run([*git, "remove", "--force", str(path)], check=False)


def commit(root: Path) -> str:
    argv = ["git", "-C", str(root), "rev-parse", "--short", "HEAD"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def run(args: argparse.Namespace, trees: dict[str, Path | None]) -> dict[str, Any]:
    """Every round of every tree; each round's samples are also appended to
    ``NAME.rounds.jsonl`` in ``--out`` as it ends, so a run cut short keeps them."""
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        for name, root in trees.items():
            began, loadavg = time.time(), os.getloadavg()[0]
            with gateway(config(args.max_num_seqs, args.threads), 600.0, root=root) as url:
                times = asyncio.run(measure(url, args.probes, args.load_streams))
            rounds.append(
                {"tree": name, "round": index, "started": began, "loadavg_1m": loadavg, **times}
            )
            print(f"round {index} {name}: " + _ratio_line(times), flush=True)
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                with (args.out / f"{args.name}.rounds.jsonl").open("a") as partial:
                    partial.write(json.dumps(rounds[-1]) + "\n")
    pooled: dict[str, Any] = {}
    for name in trees:
        mine = [r for r in rounds if r["tree"] == name]
        idle = summary([v for r in mine for v in r["idle"]])
        busy = summary([v for r in mine for v in r["busy"]])
        ratio = busy["p95_ms"] / idle["p95_ms"] if idle["p95_ms"] and busy["p95_ms"] else None
        rates = [rate for r in mine for rate in r["a_chunks_per_s"]]
        pooled[name] = {
            "idle": idle,
            "busy": busy,
            "p95_busy_over_idle": ratio,
            "a_chunks_per_s": round(sum(rates) / len(rates), 1),
        }
    return {"rounds": rounds, "pooled": pooled}


def _ratio_line(times: dict[str, list[float]]) -> str:
    idle, busy = summary(times["idle"]), summary(times["busy"])
    return f"b idle p95 {idle['p95_ms']} ms, busy p95 {busy['p95_ms']} ms"


def table(result: dict[str, Any]) -> str:
    rows = [
        "| tree | b TTFT idle p50 / p95 ms | b TTFT, a busy, p50 / p95 ms | busy / idle p95 "
        "| a's streamed chunks/s meanwhile |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["pooled"].items():
        idle, busy, ratio = row["idle"], row["busy"], row["p95_busy_over_idle"]
        shown = f"{ratio:.2f}" if ratio is not None else "-"
        rows.append(
            f"| {name} | {idle['p50_ms']} / {idle['p95_ms']} (n {idle['n']}) | "
            f"{busy['p50_ms']} / {busy['p95_ms']} (n {busy['n']}) | {shown} "
            f"| {row['a_chunks_per_s']} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.fairness", description=__doc__)
    parser.add_argument("--out", type=Path, help="Write NAME.json and NAME.md here.")
    parser.add_argument("--name", default="cpu-default", help="Base name of the files.")
    parser.add_argument("--baseline", help="Also run this git ref's tree, interleaved.")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--probes", type=int, default=30, help="b's requests per phase.")
    parser.add_argument("--load-streams", type=int, default=16, help="a's streams in flight.")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="Default: as shipped.")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads; default: as shipped (all)."
    )
    args = parser.parse_args(argv)
    # Stopped from outside: unwind, so the servers and the baseline worktree go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load_start = os.getloadavg()
    meta = study_meta("bench.studies.fairness", sys.argv[1:] if argv is None else argv)
    here = DEFAULT_CONFIG.parents[1]
    with contextlib.ExitStack() as stack:
        trees: dict[str, Path | None] = {}
        if args.baseline:
            base = stack.enter_context(worktree(args.baseline))
            trees[f"baseline {commit(base)}"] = base
        trees[f"this tree {commit(here)}"] = None
        result = run(args, trees)
    result["meta"] = meta
    result["config"] = {
        "max_num_seqs": args.max_num_seqs or "as shipped",
        "threads": args.threads or "as shipped",
        "load_streams": args.load_streams,
        "load_tokens": LOAD_TOKENS,
        "probes": args.probes,
        "probe_tokens": PROBE_TOKENS,
        "rounds": args.rounds,
        "loadavg_at_start": [round(value, 2) for value in load_start],
        "loadavg_at_end": [round(value, 2) for value in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    text = table(result)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / f"{args.name}.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
