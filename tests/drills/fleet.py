"""The fleet hold drill (issue 41, ``make bench-fleet``): thousands of concurrent
GPU-speed streams (64 chunks, 20 ms apart, from ``bench/fake_upstream.py``) measured
directly, through ``llmso serve`` with one worker and with two (``--workers``), through
LiteLLM's proxy and through the raw relay floor (``bench/raw_relay.py``).

It is the overhead suite's machinery (``bench.compare.run_compare``: the systems start
once, each level runs every system in turn, ``rounds`` times, the order rotating), with
GPU-speed streams and a table of its own (``hold_table``): per system and level, each
round against ``direct`` in the same round, then the median over the rounds, of the
requests/s ratio, the added E2E p50 and p99 and the added TTFT p50; and the server's CPU
per relayed chunk (the median round's CPU per request over 64; for llmso the whole
process group: supervisor and workers). Results go to ``--out`` (``results.*`` as the
suites write them, and ``README.md`` with the hold table and the load average at start)::

    python -m tests.drills.fleet [--concurrency 256,1024,2048] [--rounds 3]
        [--workers 1,2] [--no-peers] [--out docs/benchmarks/fleet] [--note TEXT]

``make test`` runs a short version (64 streams, one round, two workers) as an e2e test
of the mechanics (``tests/e2e/test_fleet_drill.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.compare import run_compare
from bench.native_load import UPSTREAM
from bench.report import RunRecord
from bench.spec import CompareSpec, ServiceSpec, SystemSpec
from bench.stats import Summary
from bench.suites import overhead_peers

ROOT = Path(__file__).resolve().parents[2]
CHUNKS = 64
DELAY_MS = 20
PEERS = ("raw-relay", "litellm")


def _gateway_yaml() -> str:
    return """\
server:
  host: 127.0.0.1
  port: {port}
models:
  - name: fake
    backend: openai
    base_url: http://127.0.0.1:{port_fake}/v1
    upstream_model: fake
"""


def llmso_system(root: Path, workers: int) -> SystemSpec:
    path = f"{{workdir}}/fleet-w{workers}.yaml"
    return SystemSpec(
        label=f"llmso-w{workers}",
        command=(
            str(root / ".venv/bin/llmso"),
            "serve",
            "--config",
            path,
            "--workers",
            str(workers),
        ),
        files={path: _gateway_yaml()},
        base_url="http://127.0.0.1:{port}/v1",
        health_url="http://127.0.0.1:{port}/ready",
        startup_timeout_s=180,
    )


def fleet_spec(
    root: Path,
    *,
    concurrency: Sequence[int] = (256, 1024, 2048),
    rounds: int = 3,
    workers: Sequence[int] = (1, 2),
    peers: bool = True,
    requests_per_concurrency: int = 2,
    warmup: int = 64,
    tools: str = "native",
) -> CompareSpec:
    """``tools``: ``native``, the C client and upstream of ``bench.native_load`` (a few
    us a chunk); ``python``, ``bench.client``'s aiohttp client and ``bench.fake_upstream``
    (the drill's tools before, which took most of a 2-vCPU box at 1,024 streams)."""
    if tools not in ("native", "python"):
        raise ValueError(f"tools: native or python, not {tools!r}")
    systems = [
        SystemSpec(label="direct", base_url="http://127.0.0.1:{port_fake}/v1", cpu_of="fake"),
        *(llmso_system(root, n) for n in workers),
    ]
    missing: tuple[str, ...] = ()
    if peers:
        found = [peer for peer in overhead_peers(root) if peer.label in PEERS]
        present = [peer for peer in found if Path(peer.command[0]).exists()]
        missing = tuple(
            f"{peer.label}: not measured, {peer.command[0]} is not installed"
            for peer in found
            if peer not in present
        )
        systems += present
    return CompareSpec(
        title=f"llmso fleet hold: GPU-speed streams ({CHUNKS} chunks, {DELAY_MS} ms apart)",
        model="fake",
        max_tokens=CHUNKS,
        ignore_eos=False,
        streams=(True,),
        concurrency=tuple(concurrency),
        min_requests=1,
        requests_per_concurrency=requests_per_concurrency,
        warmup=warmup,
        rounds=rounds,
        timeout_s=120,
        level_duration_s=120,
        baseline="direct",
        client="native" if tools == "native" else "aiohttp",
        notes=(
            f"upstream: {_upstream_command(root, tools)[0]} --chunks {CHUNKS} --delay-ms "
            f"{DELAY_MS} --model fake (a GPU-speed stream: one token every 20 ms)",
            "client: "
            + (
                "bench/native/sse_client.c (closed loop, keep-alive, one body)"
                if tools == "native"
                else "bench/client.py (aiohttp, every chunk parsed)"
            ),
            "llmso-wN: llmso serve --workers N, openai backend, every other setting the "
            "default (server.max_in_flight 2048 per worker)",
            "server CPU: user+system CPU of the system's process group (llmso: supervisor "
            "and workers; direct: the fake upstream) over the measured requests",
            "peers: raw-relay (bench/raw_relay.py, the floor on llmso's own server stack) "
            "and litellm (litellm[proxy] 1.108.7, one worker, LITELLM_MODE=PRODUCTION)",
            "hold table: each round against direct in the same round, then the median "
            "over the rounds",
            *missing,
        ),
        services=(
            ServiceSpec(
                name="fake",
                command=(
                    *_upstream_command(root, tools),
                    *("--port", "{port}", "--chunks", str(CHUNKS)),
                    *("--delay-ms", str(DELAY_MS), "--model", "fake"),
                ),
                health_url="http://127.0.0.1:{port}/v1/models",
            ),
        ),
        systems=tuple(systems),
    )


def _upstream_command(root: Path, tools: str) -> tuple[str, ...]:
    if tools == "native":
        return (str(UPSTREAM),)
    return (str(root / ".venv/bin/python"), "-m", "bench.fake_upstream")


def _rounds(record: RunRecord) -> tuple[Summary, ...]:
    return record.round_summaries or (record.summary,)


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def hold_table(records: Sequence[RunRecord], baseline: str = "direct") -> str:
    """Per system and level: the median over rounds of each round's figures against
    ``baseline`` in the same round, and CPU per chunk."""
    base = {r.load: r for r in records if r.system == baseline}
    rows = [
        "| system | load | ok/n | req/s | req/s ratio | E2E p50 +ms | E2E p99 +ms "
        "| TTFT p50 +ms | CPU us/chunk |",
        "|" + "---|" * 9,
    ]
    for r in sorted(records, key=lambda r: (r.concurrency or 0, r.system != baseline, r.system)):
        ref = base.get(r.load)
        if ref is None:
            continue
        pairs = list(zip(_rounds(r), _rounds(ref), strict=False))
        ratio = _median([s.requests_per_s / b.requests_per_s for s, b in pairs if b.requests_per_s])
        p50 = _median([_delta(s.e2e_ms.p50, b.e2e_ms.p50) for s, b in pairs])
        p99 = _median([_delta(s.e2e_ms.p99, b.e2e_ms.p99) for s, b in pairs])
        ttft = _median([_delta(s.ttft_ms.p50, b.ttft_ms.p50) for s, b in pairs])
        cpu = r.server_cpu_ms_per_request
        per_chunk = None if cpu is None else cpu * 1000 / CHUNKS
        same = r.system == baseline
        rows.append(
            f"| {r.system} | {r.load} | {r.summary.ok}/{r.summary.requests} "
            f"| {r.summary.requests_per_s:.0f} | {'1 (base)' if same else _fmt(ratio, '.3f')} "
            f"| {'' if same else _fmt(p50, '+.1f')} | {'' if same else _fmt(p99, '+.1f')} "
            f"| {'' if same else _fmt(ttft, '+.1f')} | {_fmt(per_chunk, '.1f')} |"
        )
    return "\n".join(rows) + "\n"


def drop_samples(path: Path, records: Sequence[RunRecord]) -> None:
    """``results.json`` with summaries only: every request's samples of a full run come
    to ~100 MB, too much to commit."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["runs"] = [record.to_json(with_samples=False) for record in records]
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _loads(load: Sequence[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in load)


def write_readme(
    out: Path,
    spec: CompareSpec,
    records: Sequence[RunRecord],
    loads: tuple[Sequence[float], Sequence[float]],
    note: str,
) -> None:
    shown = [arg for arg in sys.argv[1:] if arg != note]  # the note is said below
    lines = [
        f"# {spec.title}",
        "",
        f"Load average (1, 5, 15 min) at start: {_loads(loads[0])}; at the end: "
        f"{_loads(loads[1])}; {_cpus()} usable CPUs ({_cpu_model()}).{' ' + note if note else ''}",
        "",
        f"{spec.rounds} round(s) per level, systems interleaved; command: "
        f"`python -m tests.drills.fleet {' '.join(shown)}`.",
        "",
        hold_table(records),
        "Columns: requests/s ratio, added E2E p50/p99 and added TTFT p50 are each round's "
        "against `direct` in the same round, then the median over the rounds; CPU per "
        f"chunk is the median round's server CPU per request over {CHUNKS} chunks (for "
        "`direct`, the fake upstream's own). The pooled figures of every system and level "
        "and the machine notes: `results.md`, `results.json` (summaries only: the samples "
        "of a full run are ~100 MB).",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="256,1024,2048")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2", help="llmso systems: workers each")
    parser.add_argument("--no-peers", action="store_true", help="no LiteLLM, no raw relay")
    parser.add_argument("--requests-per-concurrency", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/fleet"))
    parser.add_argument("--note", default="", help="said beside the load average")
    parser.add_argument(
        "--tools", choices=("native", "python"), default="native", help="load client, upstream"
    )
    args = parser.parse_args(argv)
    load = os.getloadavg()
    spec = fleet_spec(
        ROOT,
        concurrency=[int(c) for c in args.concurrency.split(",")],
        rounds=args.rounds,
        workers=[int(n) for n in args.workers.split(",")],
        peers=not args.no_peers,
        requests_per_concurrency=args.requests_per_concurrency,
        tools=args.tools,
    )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmso-fleet-drill-") as workdir:
        records = asyncio.run(run_compare(spec, args.out, Path(workdir)))
    end = os.getloadavg()
    drop_samples(args.out / "results.json", records)
    write_readme(args.out, spec, records, (load, end), args.note)
    print(hold_table(records))
    print(f"{time.monotonic() - started:.0f} s; load average {_loads(load)} -> {_loads(end)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
