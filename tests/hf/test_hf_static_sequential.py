"""Static (padded, transformers forward) and sequential modes with the real SmolLM2;
crash behaviour (``stop()`` ending open streams is a check of the contract suite)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.base import BackendCrashed, TextDelta
from backends.errors import StepFailed
from backends.hf.backend import HFBackend
from backends.hf.engine.engine import MAX_FAILED_STEPS
from backends.hf.model.packed_runner import DecoderRunner
from tests.hf.helpers import RecordingObserver, collect, completion, config

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):",
    "1, 2, 3, 4,",
    "In machine learning, a neural network is a model that learns to map inputs to outputs by",
    "The sun rises in the",
]
TOKENS = 10


@pytest.fixture(scope="module")
def static_observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture(scope="module")
async def static(static_observer: RecordingObserver) -> AsyncIterator[HFBackend]:
    b = HFBackend(
        config(scheduling="static", max_batch_size=8, batch_window_ms=400), static_observer
    )
    await b.start()
    yield b
    await b.stop()


@pytest.fixture(scope="module")
def seq_observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture(scope="module")
async def sequential(seq_observer: RecordingObserver) -> AsyncIterator[HFBackend]:
    crashes: list[str] = []
    b = HFBackend(config(scheduling="sequential"), seq_observer, on_crash=crashes.append)
    b.crashes = crashes  # type: ignore[attr-defined]
    await b.start()
    yield b
    await b.stop()


@pytest.fixture(scope="module")
async def static_alone(static: HFBackend) -> list[str]:
    return [(await collect(static.generate(completion(p, TOKENS)))).text() for p in PROMPTS]


async def test_padded_static_batch_equals_alone(
    static: HFBackend, static_alone: list[str], static_observer: RecordingObserver
) -> None:
    together = await asyncio.gather(
        *(collect(static.generate(completion(p, TOKENS))) for p in PROMPTS)
    )
    assert [r.text() for r in together] == static_alone
    assert max(size for size, _, _ in static_observer.steps) == len(PROMPTS)


async def test_sequential_runs_one_at_a_time_and_matches_transformers_forward(
    sequential: HFBackend, static_alone: list[str], seq_observer: RecordingObserver
) -> None:
    results = await asyncio.gather(
        *(collect(sequential.generate(completion(p, TOKENS))) for p in PROMPTS)
    )
    # the slot-cache runner computes what transformers' own forward computes
    assert [r.text() for r in results] == static_alone
    assert max(running for running, _, _ in seq_observer.loads) == 1
    assert max(size for size, _, _ in seq_observer.steps) == 1


async def test_engine_crash_fails_requests_and_reports(sequential: HFBackend) -> None:
    stream = sequential.generate(completion(PROMPTS[0], 200))
    seen = 0
    # One failed step costs its request; a broken runner fails every step, and the
    # engine gives up after MAX_FAILED_STEPS in a row.
    with pytest.raises(StepFailed):
        async for event in stream:
            seen += isinstance(event, TextDelta)
            if seen == 2:
                _break_runner(sequential)
    for _ in range(MAX_FAILED_STEPS - 2):
        with pytest.raises(StepFailed):
            await collect(sequential.generate(completion(PROMPTS[0], 4)))
    with pytest.raises(BackendCrashed):
        await collect(sequential.generate(completion(PROMPTS[0], 4)))
    await asyncio.sleep(0.1)
    assert sequential.crashes  # type: ignore[attr-defined]
    assert not await sequential.ready()


def _break_runner(backend: HFBackend) -> None:
    """Make the next forward raise, as a real fault inside torch would."""
    parts = backend._parts
    assert parts is not None
    runner = parts.runner
    assert isinstance(runner, DecoderRunner)

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("injected fault")

    runner.forward = boom
