"""Benchmark: the per-token cost of relaying through the worker process.

Budget: 0.2 ms per token (docs/process_isolation.md). Two cases, each against the same
FakeBackend run in-process:
- burst: tokens produced back to back (the worker batches them into few frames);
- per-frame: the engine gives the loop a turn after each token, so every token travels
  in its own frame and wakes the parent's reader once (the worst case of a real engine
  that emits one token per step).

A measurement, not a test (timings on a shared machine are not pass/fail):
``python -m tests.benchmarks.ipc_cost`` prints both cases and whether each is inside
the budget, as JSON on the last line.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry

from backends.base import BackendEvent, GenerationRequest, RequestKind, SamplingParams, TextDelta
from backends.hop_metrics import BackendMetrics
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig
from tests.tools.fake_backend import FakeBackend

BUDGET_S = 0.2e-3


def _config() -> HFModelConfig:
    return HFModelConfig(name="ipc", backend="hf", source="unused", isolation="process")


def _request(tokens: int) -> GenerationRequest:
    return GenerationRequest(
        request_id="ipc",
        model="ipc",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=tokens),
        prompt=" ".join(["tok"] * tokens),
    )


async def _time_stream(events: AsyncIterator[BackendEvent], tokens: int) -> float:
    started = time.perf_counter()
    count = 0
    async for event in events:
        count += isinstance(event, TextDelta)
    elapsed = time.perf_counter() - started
    assert count == tokens
    return elapsed


async def _per_token_overhead(yield_each: bool, tokens: int, rounds: int = 3) -> float:
    """Best-of-``rounds`` (worker time - direct time) / tokens, in seconds."""
    # The in-process baseline writes the same metrics the worker's relay forwards.
    observer = BackendMetrics(CollectorRegistry()).observer("ipc")
    direct = FakeBackend(_config(), observer, yield_each=yield_each)
    await direct.start()
    backend = ProcessBackend(
        _config(),
        BackendMetrics(CollectorRegistry()),
        backend_factory="tests.tools.fake_backend:FakeBackend",
        env={"LLMSO_FAKE_YIELD_EACH": "1" if yield_each else "0"},
    )
    await backend.start()
    try:
        await _time_stream(backend.generate(_request(100)), 100)  # warm up both paths
        best_worker = best_direct = float("inf")
        for _ in range(rounds):
            best_direct = min(
                best_direct, await _time_stream(direct.generate(_request(tokens)), tokens)
            )
            best_worker = min(
                best_worker, await _time_stream(backend.generate(_request(tokens)), tokens)
            )
    finally:
        await backend.stop()
    overhead = max(0.0, best_worker - best_direct) / tokens
    mode = "per-frame" if yield_each else "burst"
    print(
        f"\nIPC {mode}: {tokens} tokens, direct {best_direct * 1e3:.1f} ms, "
        f"worker {best_worker * 1e3:.1f} ms, overhead {overhead * 1e6:.1f} us/token, "
        f"relay {tokens / best_worker:,.0f} tokens/s"
    )
    return overhead


async def measure() -> dict[str, float]:
    """Overhead per token (seconds) of both cases."""
    return {
        "burst": await _per_token_overhead(yield_each=False, tokens=20_000),
        "per_frame": await _per_token_overhead(yield_each=True, tokens=3_000),
    }


def main() -> None:
    results = asyncio.run(measure())
    verdict = {case: seconds <= BUDGET_S for case, seconds in results.items()}
    print(json.dumps({"overhead_s_per_token": results, "within_budget": verdict}))


if __name__ == "__main__":
    main()
