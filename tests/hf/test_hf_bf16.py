"""The half-precision path (the default config's dtype): SDPA decode attention and fp32
norms/softmax keep answers right, and mixed-length batches decode."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.hf.backend import HFBackend
from tests.hf.helpers import chat, collect, completion, config


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[HFBackend]:
    b = HFBackend(config(dtype="bfloat16"))
    await b.start()
    yield b
    await b.stop()


async def test_bf16_answers_and_batches(backend: HFBackend) -> None:
    assert backend.info().extra["dtype"] == "bfloat16"
    prompts = ["The capital of France is", "def add(a, b):", "One, two, three,"]
    results = await asyncio.gather(
        collect(backend.generate(chat("What is the capital of France?", 12))),
        *(collect(backend.generate(completion(p, 8))) for p in prompts),
    )
    assert "Paris" in results[0].text()
    assert all(r.usage.completion_tokens >= 1 for r in results)
