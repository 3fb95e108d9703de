"""Embeddings throughput: ``llmso serve`` (hf backend, ``task: embed``) over HTTP against
``sentence-transformers``' own ``encode()`` on the same folder, in the same run.

    python -m bench.studies.embeddings --model-path DIR --out docs/benchmarks/embeddings

For each batch size (inputs per request, or per ``encode`` call) the two systems take
turns, the order rotating per size; while ``encode`` runs the gateway is paused (SIGSTOP)
so it cannot steal CPU, and while the gateway runs ``encode`` is idle. The gateway side
also runs ``--concurrency`` clients sending one input each, which only the gateway can
batch across requests. The harness starts the gateway as a subprocess; it never imports
the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.machine import machine_info
from bench.systems import ManagedProcess, free_port

_TOPICS = ("rivers", "markets", "proteins", "compilers", "glaciers", "orchestras", "bridges")


def texts(count: int) -> list[str]:
    """Deterministic sentences of 12-20 words, like short RAG chunks."""
    out = []
    for i in range(count):
        topic, other = _TOPICS[i % len(_TOPICS)], _TOPICS[(i * 3 + 1) % len(_TOPICS)]
        extra = " and what follows from it" * (i % 3)
        out.append(f"Sentence {i} explains how {topic} relate to {other} in plain words{extra}.")
    return out


async def gateway_rate(
    session: aiohttp.ClientSession, url: str, batch: int, concurrency: int, seconds: float
) -> float:
    """Inputs embedded per second by ``concurrency`` clients sending ``batch`` inputs each."""
    pool = texts(256)
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(offset: int) -> None:
        nonlocal done
        i = offset
        while time.perf_counter() < deadline:
            body = {"model": "bench", "input": [pool[(i + k) % 256] for k in range(batch)]}
            async with asyncio.timeout(60), session.post(url, json=body) as response:
                if response.status != 200:
                    raise RuntimeError(
                        f"gateway answered {response.status}: {await response.text()}"
                    )
                await response.read()
            done += batch
            i += batch

    start = time.perf_counter()
    await asyncio.gather(*(client(c * 37) for c in range(concurrency)))
    return done / (time.perf_counter() - start)


def encode_rate(encoder: Any, batch: int, seconds: float) -> float:
    pool = texts(256)
    done, i = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        chunk = [pool[(i + k) % 256] for k in range(batch)]
        encoder.encode(chunk, batch_size=batch, convert_to_numpy=True)
        done += batch
        i += batch
    return done / (time.perf_counter() - start)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from sentence_transformers import SentenceTransformer

    meta = machine_info()
    port = free_port()
    scratch = Path(tempfile.mkdtemp(prefix="llmso-bench-embed-"))
    config = {
        "models": [
            {"name": "bench", "backend": "hf", "task": "embed", "source": str(args.model_path)}
        ]
    }
    (scratch / "config.json").write_text(json.dumps(config))  # YAML is a superset of JSON
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config",
               str(scratch / "config.json"), "--port", str(port)]  # fmt: skip
    server = ManagedProcess("llmso", command, scratch / "llmso.log")
    encoder = SentenceTransformer(str(args.model_path), device="cpu")
    rows: list[dict[str, Any]] = []
    server.start()
    try:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            base = f"http://127.0.0.1:{port}"
            await server.wait_healthy(session, base + "/ready", 300)
            url = base + "/v1/embeddings"
            await gateway_rate(session, url, 4, 1, 1.0)  # warm-up
            encode_rate(encoder, 4, 1.0)
            for turn, batch in enumerate(args.batches):
                row: dict[str, Any] = {"batch": batch}
                for system in ("llmso", "st") if turn % 2 == 0 else ("st", "llmso"):
                    if system == "llmso":
                        row["llmso"] = await gateway_rate(session, url, batch, 1, args.seconds)
                    else:
                        server.pause()
                        try:
                            row["sentence_transformers"] = encode_rate(encoder, batch, args.seconds)
                        finally:
                            server.resume()
                rows.append(row)
            rows.append(
                {
                    "batch": 1,
                    "concurrency": args.concurrency,
                    "llmso": await gateway_rate(session, url, 1, args.concurrency, args.seconds),
                }
            )
    finally:
        server.stop()
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return {"meta": meta, "seconds_per_point": args.seconds, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        "# Embeddings throughput: llmso vs sentence-transformers encode()",
        "",
        f"Machine: {meta['cpu_model']}, {meta['cpus_usable']} usable cores; load average "
        f"{meta['loadavg_at_start']} at start, {meta['loadavg_at_end']} at the end. "
        f"{result['seconds_per_point']:g} s per point.",
        "",
        "| batch (inputs per request) | clients | llmso (inputs/s, over HTTP) "
        "| sentence-transformers encode() (inputs/s, in-process) | ratio |",
        "|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        st = row.get("sentence_transformers")
        ratio = f"{row['llmso'] / st:.2f}" if st else "-"
        st_text = f"{st:.1f}" if st else "-"
        lines.append(
            f"| {row['batch']} | {row.get('concurrency', 1)} | {row['llmso']:.1f} | {st_text} "
            f"| {ratio} |"
        )
    if meta["loadavg_at_start"][0] > 0.5:
        lines += [
            "",
            "The machine was loaded while this ran (load average above 0.5 at the start; "
            "other jobs shared the cores): the numbers are indicative, compare ratios only.",
        ]
    lines += [
        "",
        "Command: `python -m bench.studies.embeddings " + " ".join(meta["argv"][1:]) + "`",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.studies.embeddings", description=__doc__)
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batches", type=lambda v: [int(x) for x in v.split(",")], default=[1, 32])
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
