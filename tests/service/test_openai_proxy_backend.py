"""OpenAIProxyBackend against the in-process fake upstream: events, errors, retries,
limits, aborts, health and metrics, and the shared backend contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.base import (
    Backend,
    BackendCrashed,
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    Overloaded,
    RequestKind,
    SamplingParams,
    Started,
    TextDelta,
    UpstreamBadResponse,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
    Usage,
)
from backends.hop_metrics import BackendMetrics
from backends.openai_proxy.backend import OpenAIProxyBackend
from bench.fake_upstream import WORDS, FakeOptions, FakeUpstream
from config.schema import OpenAIModelConfig
from tests.contract.backend_suite import BackendContract


def _config(url: str, **overrides: Any) -> OpenAIModelConfig:
    fields: dict[str, Any] = {
        "name": "proxy",
        "backend": "openai",
        "base_url": f"{url}/v1",
        "upstream_model": "fake-model",
        "health_interval": 0.05,
        "connect_timeout": 1.0,
        **overrides,
    }
    return OpenAIModelConfig(**fields)


def _chat(max_tokens: int = 4, **sampling: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="proxy",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, **sampling}),
        messages=(ChatMessage("user", "say hello"),),
    )


def _completion(max_tokens: int = 4, **sampling: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="proxy",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(**{"max_tokens": max_tokens, "temperature": 0.0, **sampling}),
        prompt="Once upon",
    )


class Harness:
    def __init__(
        self, fake: FakeUpstream, backend: OpenAIProxyBackend, registry: CollectorRegistry
    ):
        self.fake = fake
        self.backend = backend
        self.registry = registry

    def sample(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(
            name, {"model": "proxy", "backend": "openai", **labels}
        )
        return value or 0.0


async def _harness(options: FakeOptions | None = None, **overrides: Any) -> Harness:
    fake = FakeUpstream(options)
    await fake.start()
    registry = CollectorRegistry()
    backend = OpenAIProxyBackend(_config(fake.url, **overrides), BackendMetrics(registry))
    await backend.start()
    return Harness(fake, backend, registry)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = await _harness()
    yield harness
    await harness.backend.stop()
    await harness.fake.stop()


async def _collect(backend: OpenAIProxyBackend, request: GenerationRequest) -> list[BackendEvent]:
    return [event async for event in backend.generate(request)]


def _text(events: list[BackendEvent], index: int = 0) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta) and e.index == index)


async def test_chat_stream_events_in_contract_order(h: Harness) -> None:
    assert await h.backend.ready()
    events = await _collect(h.backend, _chat(max_tokens=4))
    assert isinstance(events[0], Started)
    assert _text(events) == "".join(WORDS[:4])
    assert events[-2] == Finished(0, "length")
    usage = events[-1]
    assert isinstance(usage, Usage)
    assert (usage.prompt_tokens, usage.completion_tokens) == (3, 4)
    assert usage.upstream_seconds is not None and 0 < usage.upstream_seconds < 5
    body = h.fake.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "say hello"}]
    assert h.sample("llmso_upstream_requests_total", status="200") == 1
    assert h.sample("llmso_upstream_time_to_first_token_seconds_count") == 1
    assert h.sample("llmso_upstream_latency_seconds_count") == 1
    assert h.sample("llmso_upstream_up") == 1


async def test_completion_with_n_and_logprobs(h: Harness) -> None:
    events = await _collect(h.backend, _completion(max_tokens=3, n=2, logprobs=2))
    assert _text(events, 0) == _text(events, 1) == "".join(WORDS[:3])
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert all(len(d.logprobs) == 1 and len(d.logprobs[0].top) == 2 for d in deltas)
    assert {e.index for e in events if isinstance(e, Finished)} == {0, 1}
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.completion_tokens == 6


async def test_no_usage_upstream_is_counted_and_mlx_usage_is_read() -> None:
    for options, expected_prompt in (
        (FakeOptions(usage=False), None),
        (FakeOptions(mlx_usage=True), 3),
    ):
        harness = await _harness(options)
        try:
            events = await _collect(harness.backend, _chat(max_tokens=5))
        finally:
            await harness.backend.stop()
            await harness.fake.stop()
        usage = events[-1]
        assert isinstance(usage, Usage) and usage.completion_tokens == 5
        if expected_prompt is not None:
            assert usage.prompt_tokens == expected_prompt
        else:
            assert usage.prompt_tokens > 0  # estimated from the prompt text


async def test_upstream_4xx_is_mapped_before_any_event(h: Harness) -> None:
    backend = OpenAIProxyBackend(
        _config(h.fake.url, upstream_model="missing"), BackendMetrics(CollectorRegistry())
    )
    await backend.start()
    try:
        with pytest.raises(UpstreamRejected) as info:
            await _collect(backend, _chat())
    finally:
        await backend.stop()
    assert info.value.status == 404 and info.value.param == "model"
    assert "does not exist" in info.value.message
    with pytest.raises(UpstreamRejected) as info:
        await _collect(h.backend, _chat(temperature=-1.0))
    assert info.value.status == 400 and info.value.param == "temperature"


async def test_empty_stream_reveals_the_hidden_rejection() -> None:
    harness = await _harness(engine="llamacpp")
    try:
        harness.fake.faults.extend(["empty", 400])
        with pytest.raises(UpstreamRejected) as info:
            await _collect(harness.backend, _chat())
        assert info.value.status == 400 and "injected failure" in info.value.message
        assert harness.fake.bodies[-1]["stream"] is False
        assert harness.fake.bodies[-1]["max_tokens"] == 4
        harness.fake.faults.extend(["reset", 413])
        with pytest.raises(UpstreamRejected) as info:
            await _collect(harness.backend, _chat())
        assert info.value.status == 413
    finally:
        await harness.backend.stop()
        await harness.fake.stop()
    # Engines that do not hide errors get a 502 and no second request.
    harness = await _harness()
    try:
        harness.fake.faults.append("empty")
        with pytest.raises(UpstreamBadResponse, match="empty stream"):
            await _collect(harness.backend, _chat())
        assert len(harness.fake.bodies) == 1
        harness.fake.faults.append("reset")  # a plain connection drop: retried
        assert _text(await _collect(harness.backend, _chat())) == "".join(WORDS[:4])
        assert len(harness.fake.bodies) == 3
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def test_retries_until_success_before_first_event(h: Harness) -> None:
    h.fake.faults.extend([503, "disconnect"])
    events = await _collect(h.backend, _chat())
    assert _text(events) == "".join(WORDS[:4])
    assert len(h.fake.bodies) == 3
    h.fake.faults.append("cut")  # connection lost after the role chunk, before any token
    assert _text(await _collect(h.backend, _chat())) == "".join(WORDS[:4])
    assert len(h.fake.bodies) == 5
    assert h.sample("llmso_upstream_requests_total", status="503") == 1
    assert h.sample("llmso_upstream_requests_total", status="unavailable") == 2


async def test_retries_exhausted_and_connection_refused(h: Harness) -> None:
    h.fake.faults.extend([502, 502, 502])
    with pytest.raises(UpstreamUnavailable):
        await _collect(h.backend, _chat())
    assert len(h.fake.bodies) == 3  # retries=2
    dead = OpenAIProxyBackend(
        _config("http://127.0.0.1:9", retries=1), BackendMetrics(CollectorRegistry())
    )
    await dead.start()
    try:
        assert not await dead.ready()
        with pytest.raises(UpstreamUnavailable):
            await _collect(dead, _chat())
    finally:
        await dead.stop()


async def test_breaker_fails_fast_then_recovers() -> None:
    harness = await _harness(retries=0, breaker_failures=2, breaker_cooldown=0.3)
    try:
        harness.fake.faults.extend([500, 500])
        for _ in range(2):
            with pytest.raises(UpstreamBadResponse):
                await _collect(harness.backend, _chat())
        sent = len(harness.fake.bodies)
        with pytest.raises(UpstreamUnavailable) as info:
            await _collect(harness.backend, _chat())
        assert len(harness.fake.bodies) == sent  # refused without calling the upstream
        assert 0 < info.value.retry_after <= 0.3
        await asyncio.sleep(0.35)
        assert _text(await _collect(harness.backend, _chat())) == "".join(WORDS[:4])
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def test_first_token_timeout_and_mid_stream_failures() -> None:
    harness = await _harness(first_token_timeout=0.3, retries=0)
    try:
        harness.fake.faults.append("stall")
        with pytest.raises(UpstreamTimeout):
            await _collect(harness.backend, _chat())
        assert harness.sample("llmso_upstream_requests_total", status="timeout") == 1
    finally:
        await harness.backend.stop()
        await harness.fake.stop()
    # Chunks 20 ms apart, so the fault arrives after the first event went out.
    harness = await _harness(FakeOptions(delay_ms=20), retries=0)
    try:
        for fault, error in (("break", UpstreamUnavailable), ("garbage", UpstreamBadResponse)):
            harness.fake.faults.append(fault)
            seen: list[BackendEvent] = []
            with pytest.raises(error):
                async for event in harness.backend.generate(_chat(max_tokens=10)):
                    seen.append(event)
            assert any(isinstance(e, TextDelta) for e in seen), fault
            assert not any(isinstance(e, Usage) for e in seen)
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def test_client_disconnect_aborts_upstream() -> None:
    harness = await _harness(FakeOptions(chunks=200, delay_ms=20))
    try:
        stream = harness.backend.generate(_chat(max_tokens=200))
        async for event in stream:
            if isinstance(event, TextDelta):
                break
        assert harness.fake.running == 1
        await stream.aclose()  # type: ignore[attr-defined]
        for _ in range(100):
            if harness.fake.aborted:
                break
            await asyncio.sleep(0.02)
        assert harness.fake.aborted == 1 and harness.fake.running == 0
        assert harness.sample("llmso_upstream_requests_total", status="aborted") == 1
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def test_max_concurrency_waits_then_overloads() -> None:
    harness = await _harness(
        FakeOptions(chunks=10, delay_ms=50), max_concurrency=1, queue_timeout=0.1, max_queue=1
    )
    try:
        first = asyncio.create_task(_collect(harness.backend, _chat(max_tokens=10)))
        await asyncio.sleep(0.05)
        second = asyncio.create_task(_collect(harness.backend, _chat(max_tokens=10)))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match="too many waiting"):
            await _collect(harness.backend, _chat())
        with pytest.raises(Overloaded, match="no free upstream slot"):
            await second
        assert isinstance((await first)[-1], Usage)
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def test_max_concurrency_waiter_gets_the_slot() -> None:
    harness = await _harness(FakeOptions(chunks=4, delay_ms=30), max_concurrency=1)
    try:
        first = asyncio.create_task(_collect(harness.backend, _chat()))
        await asyncio.sleep(0.03)
        assert harness.fake.running == 1
        second = await _collect(harness.backend, _chat())
        assert isinstance(second[-1], Usage) and first.done()
        assert harness.fake.running == 0 and harness.fake.completed == 2
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def test_health_hysteresis_drives_ready_and_gauge(h: Harness) -> None:
    h.fake.healthy = False
    await _until(lambda: h.sample("llmso_upstream_up") == 0)
    assert not await h.backend.ready()
    h.fake.healthy = True
    await _until(lambda: h.sample("llmso_upstream_up") == 1)
    assert await h.backend.ready()


async def test_stop_ends_open_streams_and_info() -> None:
    harness = await _harness(
        FakeOptions(chunks=200, delay_ms=20), api_key="sekret", max_concurrency=1
    )
    try:
        info = harness.backend.info()
        assert info.max_context == 2048 and info.extra["engine"] == "generic"
        stream = harness.backend.generate(_chat(max_tokens=200))
        await anext(stream)
        waiter = asyncio.create_task(_collect(harness.backend, _chat()))
        await asyncio.sleep(0.02)
        await harness.backend.stop()
        with pytest.raises(BackendCrashed):
            async for _ in stream:
                pass
        with pytest.raises(BackendCrashed):
            await waiter
        assert harness.fake.headers[-1]["Authorization"] == "Bearer sekret"
    finally:
        await harness.backend.stop()
        await harness.fake.stop()


async def _until(predicate: Any, within: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


class TestOpenAIContract(BackendContract):
    """The shared backend contract on the proxy in front of the fake upstream."""

    model = "proxy"

    def invalid_request(self) -> GenerationRequest:
        return self.request(4, temperature=-1.0)  # the upstream answers 400

    async def aborted(self, backend: Backend) -> float:
        return float(self._fake.aborted)

    @pytest.fixture(scope="class")
    async def shared(self) -> AsyncIterator[Harness]:
        harness = await _harness(FakeOptions(chunks=400, delay_ms=2))
        yield harness
        await harness.backend.stop()
        await harness.fake.stop()

    @pytest.fixture
    def backend(self, shared: Harness) -> OpenAIProxyBackend:
        self._fake = shared.fake
        return shared.backend

    @pytest.fixture
    def unstarted(self) -> OpenAIProxyBackend:
        return OpenAIProxyBackend(
            _config("http://127.0.0.1:9"), BackendMetrics(CollectorRegistry())
        )

    @pytest.fixture(scope="class")
    async def spare(self) -> AsyncIterator[OpenAIProxyBackend]:
        options = FakeOptions(chunks=400, delay_ms=2)
        harness = await _harness(options, max_concurrency=1, max_queue=1)
        yield harness.backend
        await harness.backend.stop()
        await harness.fake.stop()
