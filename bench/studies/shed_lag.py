"""One gateway process past what its core can relay: what ``server.shed_loop_lag_ms``
trades (served requests for the pace of the admitted ones).

    python -m bench.studies.shed_lag --out docs/benchmarks/shed_lag [--streams 1024]
        [--requests 3072] [--limits off,100,50,25] [--rounds 2]

The C fake upstream (``bench/native``: 64 chunks, 20 ms apart) serves ``--streams``
keep-alive connections of the C client, directly and through ``llmso serve`` (one
worker, one ``backend: openai`` model) with each ``--limits`` value of
``server.shed_loop_lag_ms`` (``off``: not set, the default). The connections start
spread over one answer's length (1.3 s), so the load is steady; a shed request's
connection waits out ``Retry-After`` (1 s) and asks again, as the SDKs do. Per system,
pooled over the rounds (systems interleaved): requests served per second, shed, TTFT,
E2E and inter-chunk gaps of the served ones, and the event loop's lag as the gateway's
``llmso_event_loop_lag_seconds`` read every 0.25 s. Writes ``results.json`` and
``README.md`` (with the load average at the start) to ``--out``. Needs ``make
bench-native``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.client import RequestResult
from bench.loadgen import new_session
from bench.machine import machine_info
from bench.native_load import CLIENT, UPSTREAM, run_client
from bench.systems import ManagedProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
CHUNKS, DELAY_MS = 64, 20
SPREAD_MS = 1300.0  # the streams' starts spread over one answer's length
TIMEOUT_S = 120.0
BODY = (
    b'{"model":"fake","messages":[{"role":"user","content":"hello"}],"stream":true,'
    b'"stream_options":{"include_usage":true},"max_tokens":64}'
)


async def _lag_samples(
    session: aiohttp.ClientSession, url: str, stop: asyncio.Event
) -> list[float]:
    samples: list[float] = []
    while not stop.is_set():
        text = ""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with asyncio.timeout(1), session.get(url) as reply:
                text = await reply.text()
        for line in text.splitlines():
            if line.startswith("llmso_event_loop_lag_seconds "):
                samples.append(float(line.split()[1]))
        await asyncio.sleep(0.25)
    return samples


async def _drive(port: int, body: Path, streams: int, requests: int) -> list[RequestResult]:
    return await run_client(
        CLIENT,
        body,
        port=port,
        concurrency=streams,
        requests=requests,
        timeout_s=TIMEOUT_S,
        spread_ms=SPREAD_MS,
    )


def _gateway_yaml(port: int, upstream: int, limit: str) -> str:
    shed = "" if limit == "off" else f"\n  shed_loop_lag_ms: {limit}"
    return (
        f"server:\n  host: 127.0.0.1\n  port: {port}{shed}\nmodels:\n  - name: fake\n"
        f"    backend: openai\n    base_url: http://127.0.0.1:{upstream}/v1\n"
        "    upstream_model: fake\n"
    )


async def _one(
    session: aiohttp.ClientSession,
    system: str,
    upstream: int,
    body: Path,
    workdir: Path,
    *,
    streams: int,
    requests: int,
) -> dict[str, Any]:
    if system == "direct":
        results = await _drive(upstream, body, streams, requests)
        return {"results": results, "lag": []}
    port = free_port()
    config = workdir / f"gateway-{system}.yaml"
    config.write_text(_gateway_yaml(port, upstream, system.removeprefix("llmso-")))
    command = (str(ROOT / ".venv/bin/llmso"), "serve", "--config", str(config))
    gateway = ManagedProcess(system, command, workdir / f"gateway-{system}.log")
    gateway.start()
    try:
        await gateway.wait_healthy(session, f"http://127.0.0.1:{port}/ready", 60)
        await _drive(port, body, 64, 64)  # warm-up: connections to the upstream
        stop = asyncio.Event()
        url = f"http://127.0.0.1:{port}/metrics"
        lag = asyncio.create_task(_lag_samples(session, url, stop))
        results = await _drive(port, body, streams, requests)
        stop.set()
        return {"results": results, "lag": await lag}
    finally:
        await asyncio.to_thread(gateway.stop)


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled figures of one system's rounds."""
    results = [r for run in runs for r in run["results"]]
    served = [r for r in results if r.ok]
    walls = []
    for run in runs:
        starts = [r.start for r in run["results"]]
        walls.append(max(r.start + r.e2e for r in run["results"]) - min(starts))
    gaps = [b - a for r in served for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)]
    lag = [v for run in runs for v in run["lag"]]
    ms = 1000.0
    return {
        "requests": len(results),
        "statuses": dict(Counter(str(r.status) for r in results)),
        "served_per_s": len(served) / sum(walls) if walls else 0.0,
        "ttft_ms": {q: _scaled(_pct([r.ttft or 0 for r in served], p), ms) for q, p in _QS},
        "e2e_ms": {q: _scaled(_pct([r.e2e for r in served], p), ms) for q, p in _QS},
        "gap_ms": {q: _scaled(_pct(gaps, p), ms) for q, p in _QS},
        "lag_ms": {
            "median": _scaled(statistics.median(lag) if lag else None, ms),
            "max": _scaled(max(lag) if lag else None, ms),
        },
    }


_QS = (("p50", 0.5), ("p99", 0.99))


def _scaled(value: float | None, by: float) -> float | None:
    return None if value is None else round(value * by, 1)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(summaries: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| system | served/s | shed | TTFT p50 / p99 ms | E2E p50 / p99 ms "
        "| chunk gap p50 / p99 ms | loop lag median / max ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        shed = sum(n for code, n in s["statuses"].items() if code in ("429", "503"))
        rows.append(
            f"| {name} | {s['served_per_s']:.0f} | {shed} of {s['requests']} "
            f"| {_fmt(s['ttft_ms']['p50'])} / {_fmt(s['ttft_ms']['p99'])} "
            f"| {_fmt(s['e2e_ms']['p50'])} / {_fmt(s['e2e_ms']['p99'])} "
            f"| {_fmt(s['gap_ms']['p50'])} / {_fmt(s['gap_ms']['p99'])} "
            f"| {_fmt(s['lag_ms']['median'])} / {_fmt(s['lag_ms']['max'])} |"
        )
    return "\n".join(rows) + "\n"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    systems = ["direct", *(f"llmso-{limit}" for limit in args.limits.split(","))]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    with tempfile.TemporaryDirectory(prefix="llmso-shed-lag-") as tmp:
        workdir = Path(tmp)
        body = workdir / "body.json"
        body.write_bytes(BODY)
        upstream = free_port()
        command = [str(UPSTREAM), "--port", str(upstream), "--chunks", str(CHUNKS)]
        command += ["--delay-ms", str(DELAY_MS), "--model", "fake"]
        fake = ManagedProcess("fake", command, workdir / "fake.log")
        fake.start()
        async with new_session(8) as session:
            try:
                await fake.wait_healthy(session, f"http://127.0.0.1:{upstream}/health", 60)
                for round_index in range(args.rounds):
                    shift = round_index % len(systems)
                    for name in systems[shift:] + systems[:shift]:
                        print(f"round {round_index + 1}: {name}", file=sys.stderr, flush=True)
                        one = await _one(
                            session,
                            name,
                            upstream,
                            body,
                            workdir,
                            streams=args.streams,
                            requests=args.requests,
                        )
                        runs[name].append(one)
            finally:
                await asyncio.to_thread(fake.stop)
    return {name: summary(system_runs) for name, system_runs in runs.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.shed_lag", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--streams", type=int, default=1024)
    parser.add_argument("--requests", type=int, default=3072)
    parser.add_argument("--limits", default="off,100,50,25", help="shed_loop_lag_ms values")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    for tool in (CLIENT, UPSTREAM):
        if not tool.exists():
            parser.error(f"{tool} is not built: run `make bench-native`")
    load = os.getloadavg()
    machine = machine_info()  # its load average is the one at the start
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    summaries = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": machine, "started_at": started, "args": vars(args) | {"out": None}}
    doc["systems"] = summaries
    (args.out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    shown = " ".join(argv if argv is not None else sys.argv[1:])
    readme = [
        "# One gateway process past its core: what `server.shed_loop_lag_ms` trades",
        "",
        f"Load average at start: {', '.join(f'{v:.2f}' for v in load)}; "
        f"{os.cpu_count()} CPUs. Command: `python -m bench.studies.shed_lag {shown}`.",
        "",
        f"{args.streams} keep-alive streams of the C client (`bench/native`), started over "
        f"1.3 s, {args.requests} requests a round, {args.rounds} rounds (systems "
        "interleaved, pooled); the C fake upstream: 64 chunks 20 ms apart. `llmso-off`: "
        "one worker, shedding by lag off (the default); `llmso-N`: "
        "`server.shed_loop_lag_ms: N`. A shed request's connection asks again after "
        "Retry-After (1 s). Served/s counts 200s only; TTFT, E2E and chunk gaps are the "
        "served requests'; loop lag is `llmso_event_loop_lag_seconds` read every 0.25 s.",
        "",
        table(summaries),
    ]
    (args.out / "README.md").write_text("\n".join(readme))
    print(table(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
