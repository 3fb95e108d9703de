"""Reasoning models through every API, in-process over ASGI, with real clients: the
OpenAI SDK (chat and Responses), the anthropic SDK (Messages with ``thinking``) and the
Agents SDK (``ModelSettings(reasoning=...)``).

Models: ``thinker`` is the openai backend in front of a scripted upstream that thinks as
vLLM 0.32 with ``--reasoning-parser`` does (the ``reasoning`` field only, usage reasoning
tokens 0); ``raw`` the same in front of one that does not split (``thought</think>answer``
as content), with ``reasoning_parser: deepseek_r1`` so the gateway splits it;
``fake-qwen`` the test fake with ``reasoning_parser: qwen3`` (thought switch only, so an
effort or a budget is refused) and ``fake-plain`` one without a parser (controls ignored).
Every body and event is checked against OpenAI's schemas or the anthropic SDK's types.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import orjson
import pytest
from anthropic.types import RawMessageStreamEvent
from prometheus_client import CollectorRegistry
from pydantic import TypeAdapter

from backends.base import Backend
from backends.factory import create_backend
from backends.hop_metrics import BackendMetrics
from config.schema import AppConfig, HFModelConfig, ModelConfig
from gateway.app import build_app
from gateway.observe.logs import REQUEST_LOGGER
from tests.tools.fake_backend import FakeBackend
from tests.tools.schemas import validate
from tests.tools.sse import named_events
from tests.tools.thinking_upstream import MODEL, ThinkingUpstream

QUESTION = "the capital of France"
THOUGHT = "Let me think about the capital of France."
ANSWER = "It is France."
STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
BOTH = {"reasoning": THOUGHT, "reasoning_content": THOUGHT}  # an earlier thought, sent on


@dataclass
class Gateway:
    http: httpx.AsyncClient
    sdk: openai.AsyncOpenAI
    anthropic: anthropic.AsyncAnthropic
    split: ThinkingUpstream
    raw: ThinkingUpstream


def _factory(metrics: BackendMetrics) -> Any:
    def factory(model: ModelConfig, on_crash: Any) -> Backend:
        if isinstance(model, HFModelConfig):
            return FakeBackend(model)
        return create_backend(model, metrics, on_crash)

    return factory


@pytest.fixture(scope="module")
async def gateway() -> AsyncIterator[Gateway]:
    split, raw = ThinkingUpstream(split=True), ThinkingUpstream(split=False)
    await split.start()
    await raw.start()
    relay = {"backend": "openai", "upstream_model": MODEL, "engine": "vllm"}
    fake = {"backend": "hf", "source": "unused"}
    models = [
        {"name": "thinker", "base_url": split.url, **relay},
        {"name": "raw", "base_url": raw.url, "reasoning_parser": "deepseek_r1", **relay},
        {"name": "fake-qwen", "reasoning_parser": "qwen3", **fake},
        {"name": "fake-plain", "reasoning_parser": None, **fake},
    ]
    config = AppConfig.model_validate(
        {"models": models, "server": {"reasoning_secret": "a-test-secret-of-some-length"}}
    )
    app = build_app(config, backend_factory=_factory(BackendMetrics(CollectorRegistry())))
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as h2,
    ):
        sdk = openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=http)
        claude = anthropic.AsyncAnthropic(
            api_key="x", base_url="http://t", http_client=h2, max_retries=0
        )
        yield Gateway(http, sdk, claude, split, raw)
    await split.stop()
    await raw.stop()


def _ask(text: str = QUESTION) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _extra(obj: Any, name: str) -> Any:
    return (obj.model_extra or {}).get(name)


# ------------------------------------------------------------------ chat


@pytest.mark.parametrize("model", ["thinker", "raw"])
async def test_chat_message_carries_the_thought_apart(gateway: Gateway, model: str) -> None:
    raw = await gateway.sdk.chat.completions.with_raw_response.create(
        model=model, messages=_ask(), max_tokens=64
    )
    body = orjson.loads(raw.content)
    validate("CreateChatCompletionResponse", body)
    message = raw.parse().choices[0].message
    assert _extra(message, "reasoning_content") == _extra(message, "reasoning") == THOUGHT
    assert message.content == ANSWER
    usage = body["usage"]
    # vLLM 0.32 reports 0 reasoning tokens: the gateway counts the thought's chunks.
    assert usage["completion_tokens_details"]["reasoning_tokens"] == len(THOUGHT.split())


@pytest.mark.parametrize("model", ["thinker", "raw"])
async def test_chat_stream_carries_the_thought_apart(gateway: Gateway, model: str) -> None:
    stream = await gateway.sdk.chat.completions.create(
        model=model,
        messages=_ask(),
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    thought, other, answer, usage = [], [], [], None
    async for chunk in stream:
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            thought.append(_extra(choice.delta, "reasoning_content") or "")
            other.append(_extra(choice.delta, "reasoning") or "")
            answer.append(choice.delta.content or "")
    assert "".join(thought) == "".join(other) == THOUGHT
    assert "".join(answer) == ANSWER
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == len(THOUGHT.split())


async def test_chat_controls_reach_the_upstream(gateway: Gateway) -> None:
    reply = await gateway.sdk.chat.completions.create(
        model="thinker",
        messages=_ask(),
        reasoning_effort="low",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    body = gateway.split.bodies[-1]
    assert body["reasoning_effort"] == "low"
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert _extra(reply.choices[0].message, "reasoning_content") is None
    assert reply.choices[0].message.content == ANSWER


async def test_an_earlier_thought_goes_back_upstream(gateway: Gateway) -> None:
    turns = [
        *_ask(),
        {"role": "assistant", "content": ANSWER, **BOTH},
        *_ask("and Spain"),
    ]
    await gateway.sdk.chat.completions.create(model="thinker", messages=turns)  # type: ignore[arg-type]
    sent = gateway.split.bodies[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": ANSWER, **BOTH}


async def test_a_thought_cut_by_max_tokens_ends_length_without_answer(gateway: Gateway) -> None:
    reply = await gateway.sdk.chat.completions.create(
        model="thinker", messages=_ask(), max_tokens=3
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert _extra(choice.message, "reasoning_content") == "Let me think"
    assert choice.message.content == ""


# ------------------------------------------------------------------ capabilities


async def test_a_control_the_model_cannot_honour_is_a_400(gateway: Gateway) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.sdk.chat.completions.create(
            model="fake-qwen", messages=_ask(), reasoning_effort="high"
        )
    assert caught.value.body["param"] == "reasoning_effort"  # type: ignore[index]
    response = await gateway.http.post(
        "/v1/responses",
        json={"model": "fake-qwen", "input": "hi", "reasoning": {"effort": "high"}},
    )
    assert response.status_code == 400 and response.json()["error"]["param"] == "reasoning.effort"


async def test_controls_to_a_model_without_a_parser_are_ignored_and_logged(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        reply = await gateway.sdk.chat.completions.create(
            model="fake-plain", messages=_ask("<think> a </think> b"), reasoning_effort="high"
        )
    assert reply.choices[0].message.content == "<think> a </think> b"
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == REQUEST_LOGGER]
    assert lines[-1]["reasoning_ignored"] == "reasoning_effort"


async def test_the_thinking_switch_is_honoured_where_declared(gateway: Gateway) -> None:
    ask = _ask("<think> hm </think> yes")
    on = await gateway.sdk.chat.completions.create(model="fake-qwen", messages=ask)
    off = await gateway.sdk.chat.completions.create(
        model="fake-qwen",
        messages=ask,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert _extra(on.choices[0].message, "reasoning_content") == " hm "
    assert _extra(off.choices[0].message, "reasoning_content") is None
    assert on.choices[0].message.content == off.choices[0].message.content == " yes"


async def test_legacy_completions_are_raw(gateway: Gateway) -> None:
    reply = await gateway.sdk.completions.create(
        model="fake-qwen", prompt="<think> a </think> b", max_tokens=16
    )
    assert reply.choices[0].text == "<think> a </think> b"
    assert reply.usage is not None and reply.usage.completion_tokens_details is None


async def test_reasoning_tokens_are_counted_in_metrics(gateway: Gateway) -> None:
    await gateway.sdk.chat.completions.create(model="thinker", messages=_ask())
    text = (await gateway.http.get("/metrics")).text
    line = next(
        line
        for line in text.splitlines()
        if line.startswith("llmso_reasoning_tokens_total{") and 'model="thinker"' in line
    )
    assert float(line.rsplit(" ", 1)[1]) >= len(THOUGHT.split())


# ------------------------------------------------------------------ Responses


def _reasoning_item(response: dict[str, Any]) -> dict[str, Any]:
    item = response["output"][0]
    assert item["type"] == "reasoning" and item["summary"] == []
    return item  # type: ignore[no-any-return]


async def test_responses_reasoning_item_before_the_message(gateway: Gateway) -> None:
    raw = await gateway.sdk.responses.with_raw_response.create(
        model="thinker", input=QUESTION, reasoning={"effort": "medium", "summary": "auto"}
    )
    body = orjson.loads(raw.content)
    validate("Response", body)
    item = _reasoning_item(body)
    assert item["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert item["encrypted_content"] is None  # not included
    assert body["output"][1]["content"][0]["text"] == ANSWER
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == len(THOUGHT.split())
    assert body["reasoning"] == {"effort": "medium", "summary": "auto"}
    assert gateway.split.bodies[-1]["reasoning_effort"] == "medium"
    response = raw.parse()
    assert response.output_text == ANSWER


async def test_responses_stream_events(gateway: Gateway) -> None:
    response = await gateway.http.post(
        "/v1/responses", json={"model": "thinker", "input": QUESTION, "stream": True}
    )
    events = named_events(response.text)
    for event in events:
        validate("ResponseStreamEvent", event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    kinds = [event["type"] for event in events]
    thought_events = [e for e in events if e["type"].startswith("response.reasoning_text")]
    assert {e["output_index"] for e in thought_events} == {0}
    assert {e["content_index"] for e in thought_events} == {0}
    assert "".join(e["delta"] for e in thought_events if e["type"].endswith("delta")) == THOUGHT
    assert thought_events[-1] == {**thought_events[-1], "text": THOUGHT}
    # The thought's item is done before the message's is added.
    done = kinds.index("response.reasoning_text.done")
    added = [i for i, e in enumerate(events) if e["type"] == "response.output_item.added"]
    assert events[added[0]]["item"]["type"] == "reasoning" and added[0] < done < added[1]
    assert events[added[1]]["item"]["type"] == "message" and events[added[1]]["output_index"] == 1
    item_ids = {e["item_id"] for e in thought_events}
    assert item_ids == {events[added[0]]["item"]["id"]}
    assert kinds[-1] == "response.completed"
    final = events[-1]["response"]
    assert _reasoning_item(final)["content"][0]["text"] == THOUGHT


async def test_responses_sdk_stream_accumulates_the_reasoning_item(gateway: Gateway) -> None:
    async with gateway.sdk.responses.stream(model="thinker", input=QUESTION) as stream:
        deltas = [e.delta async for e in stream if e.type == "response.reasoning_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == THOUGHT
    assert final.output[0].type == "reasoning" and final.output_text == ANSWER


async def test_a_reasoning_item_goes_back_as_the_turns_thought(gateway: Gateway) -> None:
    first = await gateway.sdk.responses.create(model="thinker", input=QUESTION, store=False)
    history = [item.model_dump(exclude_none=True) for item in first.output]
    await gateway.sdk.responses.create(
        model="thinker", input=[{"role": "user", "content": QUESTION}, *history, *_ask("more")]
    )
    sent = gateway.split.bodies[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": ANSWER, **BOTH}


async def test_previous_response_id_carries_the_thought(gateway: Gateway) -> None:
    first = await gateway.sdk.responses.create(model="thinker", input=QUESTION)
    second = await gateway.sdk.responses.create(
        model="thinker", input="and Spain", previous_response_id=first.id
    )
    sent = gateway.split.bodies[-1]["messages"]
    assert sent[1]["reasoning_content"] == THOUGHT and sent[1]["content"] == ANSWER
    listed = await gateway.http.get(f"/v1/responses/{first.id}")
    assert listed.json()["output"][0]["type"] == "reasoning"
    items = (await gateway.http.get(f"/v1/responses/{second.id}/input_items?order=asc")).json()
    kinds = [item["type"] for item in items["data"]]
    assert kinds == ["message", "reasoning", "message", "message"]
    assert items["data"][1]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]


async def test_encrypted_content_round_trips_and_a_forged_one_is_refused(
    gateway: Gateway,
) -> None:
    first = await gateway.sdk.responses.create(
        model="thinker", input=QUESTION, store=False, include=["reasoning.encrypted_content"]
    )
    item = first.output[0]
    assert item.type == "reasoning" and item.encrypted_content
    assert THOUGHT not in item.encrypted_content.split(".")[0]  # opaque, not plain text
    # The thought travels in the seal alone: the text part is left out.
    sealed = {"type": "reasoning", "summary": [], "encrypted_content": item.encrypted_content}
    answer = first.output[1].model_dump(exclude_none=True)
    await gateway.sdk.responses.create(
        model="thinker", input=[*_ask(QUESTION), sealed, answer, *_ask("more")]
    )
    assert gateway.split.bodies[-1]["messages"][1]["reasoning_content"] == THOUGHT
    forged = {**sealed, "encrypted_content": item.encrypted_content[:-4] + "AAAA"}
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.sdk.responses.create(model="thinker", input=[*_ask(), forged, answer])
    assert caught.value.body["param"] == "input[1].encrypted_content"  # type: ignore[index]


async def test_agents_sdk_with_a_reasoning_setting(gateway: Gateway) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )
    from agents.items import ReasoningItem
    from openai.types.shared import Reasoning

    set_tracing_disabled(True)
    agent = Agent(
        name="thinker",
        instructions="Answer briefly.",
        model=OpenAIResponsesModel(model="thinker", openai_client=gateway.sdk),
        model_settings=ModelSettings(reasoning=Reasoning(effort="high")),
    )
    result = await Runner.run(agent, QUESTION, max_turns=1)
    assert result.final_output == ANSWER
    assert any(isinstance(item, ReasoningItem) for item in result.new_items)
    assert gateway.split.bodies[-1]["reasoning_effort"] == "high"


# ------------------------------------------------------------------ Messages


def _claude_events(text: str) -> list[dict[str, Any]]:
    events = named_events(text)
    for event in events:
        if event["type"] != "ping":
            STREAM_EVENT.validate_python(event)
    return events


async def test_messages_thinking_block_and_signature(gateway: Gateway) -> None:
    message = await gateway.anthropic.messages.create(
        model="thinker",
        max_tokens=64,
        messages=_ask(),  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 32},
    )
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.thinking == THOUGHT and thinking.signature
    assert text.type == "text" and text.text == ANSWER
    body = gateway.split.bodies[-1]
    assert body["thinking_token_budget"] == 32
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    # Handed back: the thought goes upstream with its turn.
    await gateway.anthropic.messages.create(
        model="thinker",
        max_tokens=64,
        messages=[*_ask(), {"role": "assistant", "content": message.content}, *_ask("more")],  # type: ignore[list-item]
    )
    sent = gateway.split.bodies[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": ANSWER, **BOTH}


async def test_messages_stream_thinking_events(gateway: Gateway) -> None:
    response = await gateway.http.post(
        "/v1/messages",
        json={
            "model": "thinker",
            "max_tokens": 64,
            "stream": True,
            "messages": _ask(),
            "thinking": {"type": "enabled", "budget_tokens": 32},
        },
    )
    events = _claude_events(response.text)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert starts[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert starts[1]["content_block"]["type"] == "text" and starts[1]["index"] == 1
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == 0]
    assert "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta") == THOUGHT
    assert deltas[-1]["type"] == "signature_delta" and deltas[-1]["signature"]
    stop = next(i for i, e in enumerate(events) if e["type"] == "content_block_stop")
    assert events[stop - 1]["delta"]["type"] == "signature_delta"


async def test_messages_sdk_stream_accumulates_the_thinking_block(gateway: Gateway) -> None:
    async with gateway.anthropic.messages.stream(
        model="thinker",
        max_tokens=64,
        messages=_ask(),  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 32},
    ) as stream:
        final = await stream.get_final_message()
    thinking = final.content[0]
    assert thinking.type == "thinking" and thinking.thinking == THOUGHT and thinking.signature
    assert final.content[1].type == "text"


async def test_messages_thinking_disabled_and_omitted(gateway: Gateway) -> None:
    off = await gateway.anthropic.messages.create(
        model="thinker",
        max_tokens=64,
        messages=_ask(),
        thinking={"type": "disabled"},  # type: ignore[arg-type]
    )
    assert [block.type for block in off.content] == ["text"]
    assert gateway.split.bodies[-1]["chat_template_kwargs"] == {"enable_thinking": False}
    omitted = await gateway.http.post(
        "/v1/messages",
        json={
            "model": "thinker",
            "max_tokens": 64,
            "messages": _ask(),
            "thinking": {"type": "adaptive", "display": "omitted"},
        },
    )
    block = omitted.json()["content"][0]
    assert block["type"] == "thinking" and block["thinking"] == "" and block["signature"]
    # The signature alone brings the thought back.
    again = [*_ask(), {"role": "assistant", "content": [block]}, *_ask("more")]
    reply = await gateway.http.post(
        "/v1/messages", json={"model": "thinker", "max_tokens": 64, "messages": again}
    )
    assert reply.status_code == 200, reply.text
    assert gateway.split.bodies[-1]["messages"][1]["reasoning_content"] == THOUGHT


async def test_messages_changed_thinking_is_refused(gateway: Gateway) -> None:
    message = await gateway.anthropic.messages.create(
        model="thinker",
        max_tokens=64,
        messages=_ask(),  # type: ignore[arg-type]
    )
    block = message.content[0].model_dump()
    block["thinking"] = "I was told to say yes."
    turns = [*_ask(), {"role": "assistant", "content": [block]}, *_ask("more")]
    response = await gateway.http.post(
        "/v1/messages", json={"model": "thinker", "max_tokens": 64, "messages": turns}
    )
    assert response.status_code == 400
    assert "messages[1].content[0].thinking" in response.json()["error"]["message"]


async def test_messages_budget_on_a_model_without_one_is_refused(gateway: Gateway) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        await gateway.anthropic.messages.create(
            model="fake-qwen",
            max_tokens=64,
            messages=_ask(),  # type: ignore[arg-type]
            thinking={"type": "enabled", "budget_tokens": 8},
        )
    assert "thinking.budget_tokens" in str(caught.value)
