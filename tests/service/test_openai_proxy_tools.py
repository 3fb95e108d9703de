"""Tools and structured outputs through the openai backend, against a scripted upstream.

The upstream records what the gateway forwards (tools, tool_choice, response_format,
logit_bias, image parts, unknown fields, include_usage forced on) and answers with the
exact chunk sequence OpenAI streams for two parallel tool calls, usage chunk last. The
official SDK's stream helper must rebuild both calls intact (the bug class where usage
chunks or re-framing collapse streamed tool arguments).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from aiohttp import web

from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.schemas import validate

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
ARGS = ['{"ci', 'ty": "Os', 'lo"}']


def _chunk(delta: dict[str, Any], reason: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    body = {
        "id": "up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up",
        "choices": [choice],
        **extra,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _script(repeat_ids: bool) -> list[bytes]:
    """OpenAI's framing; with ``repeat_ids`` an engine that repeats id/name every delta."""
    frames = [_chunk({"role": "assistant", "content": None})]
    for call, name in ((0, "get_weather"), (1, "get_weather")):
        head = {
            "index": call,
            "id": f"call_up{call}",
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        frames.append(_chunk({"tool_calls": [head]}))
        for fragment in ARGS:
            piece: dict[str, Any] = {"index": call, "function": {"arguments": fragment}}
            if repeat_ids:
                piece = {**head, "function": {"name": name, "arguments": fragment}}
            frames.append(_chunk({"tool_calls": [piece]}))
    frames.append(_chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}
    frames.append(
        b"data: "
        + orjson.dumps(
            {
                "id": "up",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "up",
                "choices": [],
                "usage": usage,
            }
        )
        + b"\n\n"
    )
    frames.append(b"data: [DONE]\n\n")
    return frames


class Upstream:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.repeat_ids = False
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "up", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in _script(self.repeat_ids):
            await response.write(frame)
        await response.write_eof()
        return response


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[Upstream]:
    up = Upstream()
    await up.start()
    yield up
    assert up.runner is not None
    await up.runner.cleanup()


@pytest.fixture(scope="module")
async def sdk(upstream: Upstream) -> AsyncIterator[openai.AsyncOpenAI]:
    config = AppConfig.model_validate(
        {
            "models": [
                {
                    "name": "proxy",
                    "backend": "openai",
                    "base_url": upstream.url + "/v1",
                    "upstream_model": "up",
                    "engine": "vllm",
                }
            ]
        }
    )
    app = build_app(config)
    lifespan = app.lifespan()
    await lifespan.__aenter__()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    yield openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=http)
    await http.aclose()
    await lifespan.__aexit__(None, None, None)


async def test_everything_is_forwarded_untouched(
    sdk: openai.AsyncOpenAI, upstream: Upstream
) -> None:
    image = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA==", "detail": "low"},
    }
    schema = {"name": "w", "schema": {"type": "object"}, "strict": True}
    await sdk.chat.completions.create(
        model="proxy",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
        response_format={"type": "json_schema", "json_schema": schema},  # type: ignore[typeddict-item]
        logit_bias={"42": -100},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    body = upstream.bodies[-1]
    assert body["tools"] == [TOOL]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == {"type": "json_schema", "json_schema": schema}
    assert body["logit_bias"] == {"42": -100}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["messages"][0]["content"][1] == image
    assert body["messages"][1]["content"] is None
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"city":"Oslo"}'
    assert body["messages"][2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("repeat_ids", [False, True])
async def test_streamed_tool_calls_survive_intact(
    sdk: openai.AsyncOpenAI, upstream: Upstream, repeat_ids: bool
) -> None:
    upstream.repeat_ids = repeat_ids
    async with sdk.chat.completions.stream(
        model="proxy",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[TOOL],  # type: ignore[list-item]
        stream_options={"include_usage": True},
    ) as stream:
        async for event in stream:
            if event.type == "chunk":
                validate(
                    "CreateChatCompletionStreamResponse",
                    event.chunk.model_dump(mode="json", exclude_unset=True),
                )
                for choice in event.chunk.choices:
                    for call in choice.delta.tool_calls or ():
                        named = call.id is not None
                        assert named == (
                            call.function is not None and call.function.name is not None
                        ), "id and name come together, once"
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [c.id for c in calls] == ["call_up0", "call_up1"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Oslo"}] * 2  # type: ignore[union-attr]
    assert final.usage is not None and final.usage.completion_tokens == 12


async def test_non_streamed_tool_calls(sdk: openai.AsyncOpenAI, upstream: Upstream) -> None:
    upstream.repeat_ids = False
    raw = await sdk.chat.completions.with_raw_response.create(
        model="proxy",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[TOOL],  # type: ignore[list-item]
    )
    body = json.loads(raw.text)
    validate("CreateChatCompletionResponse", body)
    message = body["choices"][0]["message"]
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ['{"city": "Oslo"}'] * 2


LEGACY_FUNCTION = TOOL["function"]


async def test_legacy_functions_get_a_function_call(
    sdk: openai.AsyncOpenAI, upstream: Upstream
) -> None:
    """A ``functions`` request is answered in its own era's shape: ``message.function_call``
    (the first call only; one is asked for upstream) and finish reason ``function_call``."""
    upstream.repeat_ids = False
    raw = await sdk.chat.completions.with_raw_response.create(
        model="proxy",
        messages=[{"role": "user", "content": "weather?"}],
        functions=[LEGACY_FUNCTION],  # type: ignore[list-item]
        function_call={"name": "get_weather"},
    )
    body = json.loads(raw.text)
    validate("CreateChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert "tool_calls" not in choice["message"] and choice["message"]["content"] is None
    call = choice["message"]["function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo"}
    sent = upstream.bodies[-1]
    assert sent["parallel_tool_calls"] is False
    assert sent["tools"] == [{"type": "function", "function": LEGACY_FUNCTION}]


async def test_legacy_functions_stream_function_call_deltas(
    sdk: openai.AsyncOpenAI, upstream: Upstream
) -> None:
    upstream.repeat_ids = True
    stream = await sdk.chat.completions.create(
        model="proxy",
        messages=[{"role": "user", "content": "weather?"}],
        functions=[LEGACY_FUNCTION],  # type: ignore[list-item]
        stream=True,
    )
    names, arguments, reasons = [], [], []
    async for chunk in stream:
        validate(
            "CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True)
        )
        for choice in chunk.choices:
            assert choice.delta.tool_calls is None
            if choice.delta.function_call is not None:
                names.append(choice.delta.function_call.name)
                arguments.append(choice.delta.function_call.arguments or "")
            if choice.finish_reason is not None:
                reasons.append(choice.finish_reason)
    assert [n for n in names if n is not None] == ["get_weather"]  # named once, first
    assert names[0] == "get_weather"
    assert json.loads("".join(arguments)) == {"city": "Oslo"}  # the second call dropped
    assert reasons == ["function_call"]
