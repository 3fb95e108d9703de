"""A failed step costs its requests, not the model.

A failure is injected into the runner's forward after it has written that step's keys
and values into the slot cache (the forward runs, then raises), in the shipped dtype
(bf16). The step's requests end with a 500 ``engine_step_failed``; the engine keeps
serving, and what it serves next equals a clean run's greedy text. Only failures in a
row take the engine down (then the registry restarts it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from backends.base import BackendCrashed, TextDelta
from backends.errors import StepFailed
from backends.hf.backend import HFBackend
from backends.hf.engine.engine import MAX_FAILED_STEPS
from backends.hf.model import packed_runner
from tests.hf.helpers import RecordingObserver, chat, collect, completion, config

pytestmark = pytest.mark.slow


class Fault:
    """Arms failures of the runner's forward (after the real forward has run)."""

    def __init__(self) -> None:
        self.remaining = 0
        self.raised = 0


@pytest.fixture
def fault(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fault]:
    armed = Fault()
    real = packed_runner.DecoderRunner.forward

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        logits = real(self, *args, **kwargs)  # the KV writes of this step happen here
        if armed.remaining > 0:
            armed.remaining -= 1
            armed.raised += 1
            raise RuntimeError("injected fault after the step's KV writes")
        return logits

    monkeypatch.setattr(packed_runner.DecoderRunner, "forward", forward)
    yield armed


async def test_a_failed_step_fails_its_requests_and_the_engine_serves_on(fault: Fault) -> None:
    observer = RecordingObserver()
    crashes: list[str] = []
    backend = HFBackend(config(dtype="bfloat16"), observer, on_crash=crashes.append)
    await backend.start()
    try:
        first = chat("What is the capital of France?", max_tokens=24)
        second = completion("The three primary colours are", max_tokens=24)
        clean = [
            (await collect(backend.generate(first))).text(),
            (await collect(backend.generate(second))).text(),
        ]

        victim = backend.generate(chat("Write a long story about a dragon.", max_tokens=64))
        deltas = 0
        with pytest.raises(StepFailed) as failed:
            async for event in victim:
                deltas += isinstance(event, TextDelta)
                if deltas == 3:
                    fault.remaining = 1  # the next step fails mid-stream
        assert fault.raised == 1 and deltas >= 3
        assert failed.value.status == 500 and failed.value.code == "engine_step_failed"

        # One after another: bf16 rows batched together may differ from each alone.
        after = [
            (await collect(backend.generate(first))).text(),
            (await collect(backend.generate(second))).text(),
        ]
        assert after == clean
        assert observer.step_errors == 1
        assert crashes == [] and await backend.ready()
    finally:
        await backend.stop()


async def test_failures_in_a_row_take_the_engine_down(fault: Fault) -> None:
    crashes: list[str] = []
    backend = HFBackend(config(dtype="bfloat16"), RecordingObserver(), on_crash=crashes.append)
    await backend.start()
    try:
        fault.remaining = MAX_FAILED_STEPS
        errors = []
        for _ in range(MAX_FAILED_STEPS):
            with pytest.raises((StepFailed, BackendCrashed)) as raised:
                await collect(backend.generate(completion("Hello", max_tokens=4)))
            errors.append(type(raised.value))
        assert errors == [StepFailed] * (MAX_FAILED_STEPS - 1) + [BackendCrashed]
        for _ in range(50):
            if crashes:
                break
            await asyncio.sleep(0.05)
        assert crashes and "injected fault" in crashes[0]
        assert not await backend.ready()
    finally:
        await backend.stop()
