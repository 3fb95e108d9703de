"""Continuous batching with the real SmolLM2: equivalence, cancellation, sampling, errors,
and the shared backend contract (``TestHFContract``).

One fp32 backend is loaded for the module (plus one small-queue spare for the contract's
overload and stop checks); every test uses few tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.base import ContextLengthExceeded, GenerationRequest, Tenant, TextDelta
from backends.hf.backend import HFBackend
from backends.hf.loading.memory_estimate import (
    estimate_memory_bytes,
    kv_bytes_per_token,
    weights_bytes,
)
from tests.hf.engine_contract import EngineContract
from tests.hf.helpers import RecordingObserver, chat, collect, completion, config, model_path

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "The quick brown fox",
    "Water boils at a temperature of",
    "In machine learning, a neural network is a model that learns to map inputs to outputs by",
    "My favourite colour is",
    "The three primary colours are red,",
    "Python is a programming language that",
    "To make a cup of tea, first",
    "The sun rises in the",
    "import numpy as np\nx = np.arange(10)\nprint(",
    "A haiku about autumn:\n",
    "Q: What is the largest planet in our solar system?\nA:",
    "The Eiffel Tower was built in the year",
]
TOKENS = 12


@pytest.fixture(scope="module")
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture(scope="module")
async def backend(observer: RecordingObserver) -> AsyncIterator[HFBackend]:
    b = HFBackend(config(scheduling="continuous", max_num_seqs=24), observer)
    await b.start()
    yield b
    await b.stop()


@pytest.fixture(scope="module")
async def alone(backend: HFBackend) -> list[str]:
    """Each prompt's greedy output with nothing else running."""
    return [(await collect(backend.generate(completion(p, TOKENS)))).text() for p in PROMPTS]


async def test_info_reports_context_and_memory(backend: HFBackend) -> None:
    info = backend.info()
    assert info.max_context == 8192
    # fp32 weights, plus the prefix pool at its budget (on by default): what the registry
    # must count before that pool has grown
    pool = 8192 * kv_bytes_per_token(Path(model_path()), "float32")
    assert pool == 8192 * 30 * 2 * 3 * 64 * 4
    assert info.memory_bytes is not None and 400e6 < info.memory_bytes - pool < 700e6
    assert estimate_memory_bytes(config()) == weights_bytes(Path(model_path()), "float32") + pool
    assert await backend.ready()


async def test_staggered_concurrent_greedy_equals_alone(
    backend: HFBackend, alone: list[str], observer: RecordingObserver
) -> None:
    async def late(i: int, prompt: str) -> str:
        await asyncio.sleep(0.03 * i)
        return (await collect(backend.generate(completion(prompt, TOKENS)))).text()

    before = len(observer.steps)
    together = await asyncio.gather(*(late(i, p) for i, p in enumerate(PROMPTS)))
    assert together == alone
    assert len(set(alone)) == len(alone)
    assert max(size for size, _, _ in observer.steps[before:]) >= 8  # really batched


async def _a_busy_then_b(
    backend: HFBackend, alone: list[str], observer: RecordingObserver
) -> list[int]:
    """Key a's eight streams, then key b's request while they decode; checks every
    answer against its prompt alone and returns the steps' batch sizes."""

    def keyed(prompt: str, key: str) -> GenerationRequest:
        return dataclasses.replace(completion(prompt, TOKENS), tenant=Tenant(key))

    async def run(prompt: str, key: str) -> str:
        return (await collect(backend.generate(keyed(prompt, key)))).text()

    before = len(observer.steps)
    a_side = [asyncio.create_task(run(p, "a")) for p in PROMPTS[:8]]
    for _ in range(400):  # until a's eight decode
        if len(observer.steps) > before and observer.loads[-1][0] == 8:
            break
        await asyncio.sleep(0.005)
    b_side = await run(PROMPTS[8], "b")
    assert [*(await asyncio.gather(*a_side)), b_side] == alone[:9]
    return [size for size, _, _ in observer.steps[before:]]


def _newcomer_step_between(sizes: list[int]) -> bool:
    """A step of one row (b's prompt) between a's eight rows and the nine after it."""
    return any(sizes[i - 1 : i + 2] == [8, 1, 9] for i in range(1, len(sizes) - 1))


async def test_a_newcomer_key_beside_another_keys_streams_equals_alone(
    backend: HFBackend, alone: list[str], observer: RecordingObserver
) -> None:
    """Key a's eight streams decode; key b's request, from a key holding no slot, is
    prefilled in a step of its own (a newcomer step: one row, between steps of eight
    and nine), and every answer still equals the same prompt alone. With
    ``newcomer_steps: false`` b's prompt joins a's rows' step (nine rows at once)."""
    newcomer_steps = observer.newcomer_steps
    sizes = await _a_busy_then_b(backend, alone, observer)
    assert _newcomer_step_between(sizes), sizes
    assert observer.newcomer_steps == newcomer_steps + 1  # llmso_worker_newcomer_steps_total
    off_observer = RecordingObserver()
    off = HFBackend(config(max_num_seqs=24, newcomer_steps=False), off_observer)
    await off.start()
    try:
        sizes = await _a_busy_then_b(off, alone, off_observer)
    finally:
        await off.stop()
    assert not _newcomer_step_between(sizes) and 9 in sizes, sizes
    assert off_observer.newcomer_steps == 0


async def test_one_of_eight_disconnects(
    backend: HFBackend, alone: list[str], observer: RecordingObserver
) -> None:
    aborts_before = observer.aborts

    async def leaves_early(prompt: str) -> int:
        stream = backend.generate(completion(prompt, 200))
        seen = 0
        async for event in stream:
            seen += isinstance(event, TextDelta)
            if seen == 3:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return seen

    async def stays(prompt: str) -> str:
        return (await collect(backend.generate(completion(prompt, TOKENS)))).text()

    results = await asyncio.gather(leaves_early(PROMPTS[1]), *(stays(p) for p in PROMPTS[8:15]))
    assert results[0] == 3
    assert results[1:] == alone[8:15]
    for _ in range(50):  # the abort lands at the next step boundary
        if observer.aborts > aborts_before and observer.loads[-1][0] == 0:
            break
        await asyncio.sleep(0.05)
    assert observer.aborts == aborts_before + 1
    assert observer.loads[-1][0] == 0  # nothing left running: no compute for the leaver


async def test_stop_string_across_tokens_is_cut(backend: HFBackend, alone: list[str]) -> None:
    reference = alone[1]
    stop = reference[6:14]
    result = await collect(backend.generate(completion(PROMPTS[1], TOKENS, stop=(stop, "@@@"))))
    assert result.text() == reference[: reference.index(stop)]
    assert result.reason() == "stop"


async def test_length_and_eos(backend: HFBackend) -> None:
    capped = await collect(backend.generate(completion(PROMPTS[0], 5)))
    assert capped.reason() == "length" and capped.usage.completion_tokens == 5
    short = await collect(backend.generate(chat("Reply with just the word: yes", 40)))
    assert short.reason() == "stop"
    assert short.usage.completion_tokens < 40
    assert "<|im_end|>" not in short.text()


async def test_seeded_sampling_same_alone_and_in_busy_batch(backend: HFBackend) -> None:
    request = completion(PROMPTS[6], TOKENS, temperature=0.9, top_p=0.95, seed=1234)
    solo = (await collect(backend.generate(request))).text()
    busy = await asyncio.gather(
        *(collect(backend.generate(completion(p, TOKENS))) for p in PROMPTS[:6]),
        collect(backend.generate(request)),
    )
    assert busy[-1].text() == solo
    other_seed = completion(PROMPTS[6], TOKENS, temperature=0.9, top_p=0.95, seed=99)
    assert (await collect(backend.generate(other_seed))).text() != solo


async def test_n_choices_share_prefill_and_carry_logprobs(backend: HFBackend) -> None:
    request = chat("Write three emoji.", 10, n=3, temperature=1.0, seed=5, logprobs=2)
    result = await collect(backend.generate(request))
    texts = [result.text(i) for i in range(3)]
    assert len(set(texts)) > 1
    deltas = [d for d in result.events if isinstance(d, TextDelta)]
    # every sampled token carries one logprob entry; an end-of-sequence token none
    eos = sum(result.reason(i) == "stop" for i in range(3))
    assert result.usage.completion_tokens == sum(len(d.logprobs) for d in deltas) + eos
    assert result.usage.completion_tokens == sum(d.num_tokens for d in deltas) + eos
    for i in range(3):
        entries = [
            lp
            for d in result.events
            if isinstance(d, TextDelta) and d.index == i
            for lp in d.logprobs
        ]
        assert all(len(e.top) == 2 and e.logprob <= 0.0 for e in entries)
        raw = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")
        assert raw.startswith(texts[i].rstrip("\ufffd"))


async def test_greedy_top_k_and_penalties(backend: HFBackend, alone: list[str]) -> None:
    top1 = completion(PROMPTS[3], TOKENS, temperature=1.0, top_k=1, seed=3)
    assert (await collect(backend.generate(top1))).text() == alone[3]
    penalised = completion(PROMPTS[3], TOKENS, frequency_penalty=2.0, presence_penalty=1.0)
    assert (await collect(backend.generate(penalised))).text() != alone[3]


async def test_context_length_checked_before_first_event(backend: HFBackend) -> None:
    with pytest.raises(ContextLengthExceeded):
        await anext(backend.generate(completion(PROMPTS[0], 8190)))
    explicit = completion(PROMPTS[0], 8190)
    implicit = dataclasses.replace(
        explicit, sampling=dataclasses.replace(explicit.sampling, max_tokens=None)
    )
    stream = backend.generate(implicit)
    first = await anext(stream)
    assert first.__class__.__name__ == "Started"
    await stream.aclose()  # type: ignore[attr-defined]


async def test_chunked_prefill_under_a_small_token_budget(alone: list[str]) -> None:
    observer = RecordingObserver()
    b = HFBackend(config(max_num_seqs=4, max_num_batched_tokens=12), observer)
    await b.start()
    try:
        picks = [1, 6, 12, 0]
        results = await asyncio.gather(
            *(collect(b.generate(completion(PROMPTS[i], TOKENS))) for i in picks)
        )
        assert [r.text() for r in results] == [alone[i] for i in picks]
        assert max(tokens for _, tokens, _ in observer.steps) <= 12
        # prompts of ~20 tokens needed several steps while others were decoding
        assert any(size > 1 and tokens > size for size, tokens, _ in observer.steps)
    finally:
        await b.stop()


class TestHFContract(EngineContract):
    """The shared backend contract on the in-process engine (thread)."""

    @pytest.fixture
    def unstarted(self) -> HFBackend:
        return HFBackend(config())

    @pytest.fixture(scope="class")
    async def spare(self) -> AsyncIterator[HFBackend]:
        spare = HFBackend(config(scheduling="static", batch_window_ms=0, max_queue=2))
        await spare.start()
        yield spare
        await spare.stop()
