"""``/v1/messages`` and ``/v1/messages/count_tokens`` in-process over ASGI with the
scripted backend, driven by the official ``anthropic`` SDK and by raw HTTP: bodies and
every stream event validated against the SDK's own types, the exact event sequence,
stop reasons, the translation onto the chat contract, and every refusal in Anthropic's
error envelope naming its field."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import httpx2
import orjson
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from config.frontdoor import hash_key
from config.schema import AppConfig
from gateway.app import build_app
from gateway.observe.logs import REQUEST_LOGGER
from tests.tools.scripted_responses import ScriptedBackend, scripted_factory
from tests.tools.sse import named_events

STREAM_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
TOOL = {
    "name": "get_weather",
    "description": "Weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = 'call get_weather {"city": "Oslo"}'
KEY = "sk-anthropic-client-0123"


class Clients:
    def __init__(self, http: httpx.AsyncClient, sdk: anthropic.AsyncAnthropic) -> None:
        self.http = http
        self.sdk = sdk
        self.backends: dict[str, ScriptedBackend] = {}

    def last_request(self, model: str = "alpha") -> Any:
        return self.backends[model].calls[-1]


@pytest.fixture
async def clients() -> AsyncIterator[Clients]:
    backends: dict[str, ScriptedBackend] = {}
    models = [
        {"name": n, "backend": "openai", "base_url": "http://unused"}
        for n in ("alpha", "broken", "plain")
    ]
    auth = {"required": True, "keys": [{"name": "team", "key_sha256": hash_key(KEY)}]}
    config = AppConfig.model_validate({"models": models, "auth": auth})
    app = build_app(config, backend_factory=scripted_factory(backends))
    async with (
        app.lifespan(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers={"x-api-key": KEY}
        ) as http,
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t") as h2,
    ):
        sdk = anthropic.AsyncAnthropic(
            api_key=KEY, base_url="http://t", http_client=h2, max_retries=0
        )
        made = Clients(http, sdk)
        made.backends = backends
        yield made


def events_of(text: str) -> list[dict[str, Any]]:
    events = named_events(text)
    for event in events:
        if event["type"] == "ping":
            assert event == {"type": "ping"}
        elif event["type"] == "error":
            assert set(event) == {"type", "error"} and set(event["error"]) == {"type", "message"}
        else:  # the SDK's own types of the other events
            STREAM_EVENT.validate_python(event)
    return events


def assert_error(response: httpx.Response, status: int, kind: str, names: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert body["error"]["type"] == kind, body
    message: str = body["error"]["message"]
    assert names in message, message
    return message


async def post(clients: Clients, path: str = "/v1/messages", **fields: Any) -> httpx.Response:
    body = {"model": "alpha", "max_tokens": 16, **fields}
    return await clients.http.post(path, json=body)


async def test_text_message_and_translation(clients: Clients) -> None:
    message = await clients.sdk.messages.create(
        model="alpha",
        max_tokens=16,
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        messages=[{"role": "user", "content": "hello there world"}],
        stop_sequences=["zz"],
        metadata={"user_id": "u-1"},
        service_tier="auto",  # accepted, no effect
        # Sampling fields this SDK release no longer names, as older clients send them,
        # and a field llmso does not know (ignored).
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 7, "not_a_field": 1},
    )
    Message.model_validate(message.model_dump())
    assert message.id.startswith("msg_") and message.type == "message"
    assert message.role == "assistant" and message.model == "alpha"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "hello there world"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 3)
    request = clients.last_request()
    assert request.messages[0].role == "system"
    assert request.messages[0].content == "Be brief.\nBe kind."
    assert request.messages[1].content == "hello there world"
    sampling = request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (
        16,
        0.5,
        0.9,
        7,
    )
    assert sampling.stop == ("zz",) and request.user == "u-1"


async def test_max_tokens_stop_reason(clients: Clients) -> None:
    message = await clients.sdk.messages.create(
        model="alpha", max_tokens=2, messages=[{"role": "user", "content": "a b c d"}]
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2


async def test_stop_sequence_is_named(clients: Clients) -> None:
    message = await clients.sdk.messages.create(
        model="alpha",
        max_tokens=16,
        stop_sequences=["END", "halt"],
        messages=[{"role": "user", "content": "one two halt three"}],
    )
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "halt"
    assert message.content[0].text == "one two"  # type: ignore[union-attr]
    response = await post(
        clients,
        stream=True,
        stop_sequences=["halt"],
        messages=[{"role": "user", "content": "one halt"}],
    )
    delta = [event for event in events_of(response.text) if event["type"] == "message_delta"]
    assert delta[0]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "halt"}


async def test_stream_event_sequence(clients: Clients) -> None:
    response = await post(
        clients, max_tokens=2, stream=True, messages=[{"role": "user", "content": "a b c"}]
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    assert [event["type"] for event in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["id"].startswith("msg_") and start["content"] == []
    assert start["stop_reason"] is None
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    deltas = [event["delta"] for event in events if event["type"] == "content_block_delta"]
    assert deltas == [{"type": "text_delta", "text": "a"}, {"type": "text_delta", "text": " b"}]
    assert events[6]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[6]["usage"] == {
        "input_tokens": 3,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 2,
    }


async def test_stream_helper_with_tool_use(clients: Clients) -> None:
    async with clients.sdk.messages.stream(
        model="alpha",
        max_tokens=32,
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": CALL}],
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert "input_json" in kinds and kinds[-1] == "message_stop"
    [block] = final.content
    assert block.type == "tool_use" and block.name == "get_weather"
    assert block.id.startswith("toolu_") and block.input == {"city": "Oslo"}
    assert final.stop_reason == "tool_use"
    request = clients.last_request()
    assert request.tool_choice.mode == "named" and request.tool_choice.name == "get_weather"
    assert request.tools[0].parameters == TOOL["input_schema"]


async def test_tool_result_round_trip_translation(clients: Clients) -> None:
    first = await clients.sdk.messages.create(
        model="alpha",
        max_tokens=32,
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=[{"role": "user", "content": CALL}],
    )
    call = first.content[0]
    assert call.type == "tool_use"
    assert clients.last_request().tool_choice.mode == "required"
    assert clients.last_request().parallel_tool_calls is False
    answer = await clients.sdk.messages.create(
        model="alpha",
        max_tokens=32,
        tools=[TOOL],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": CALL},
            {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "sunny"},
                    {"type": "text", "text": "so it is sunny"},
                ],
            },
        ],
    )
    assert answer.content[0].text == "so it is sunny"  # type: ignore[union-attr]
    roles = [(m.role, m.content) for m in clients.last_request().messages]
    assert roles == [
        ("user", CALL),
        ("assistant", ""),
        ("tool", "sunny"),
        ("user", "so it is sunny"),
    ]
    replayed = clients.last_request().messages[1].tool_calls[0]
    assert (replayed.id, replayed.name) == (call.id, "get_weather")
    assert orjson.loads(replayed.arguments) == {"city": "Oslo"}
    assert clients.last_request().messages[2].tool_call_id == call.id


async def test_tool_choice_none_and_auto(clients: Clients) -> None:
    for kind in ("none", "auto"):
        await clients.sdk.messages.create(
            model="alpha",
            max_tokens=8,
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice={"type": kind},  # type: ignore[misc]
            messages=[{"role": "user", "content": "hi"}],
        )
        assert clients.last_request().tool_choice.mode == kind


async def test_count_tokens(clients: Clients) -> None:
    counted = await clients.sdk.messages.count_tokens(
        model="alpha",
        system="sys",
        tools=[TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "one two three four"}],
    )
    assert counted.input_tokens == 4
    request = clients.last_request()
    assert request.sampling.max_tokens == 1 and request.tool_choice is None
    assert request.tools and request.messages[0].content == "sys"


async def test_mid_stream_failure_is_an_error_event(clients: Clients) -> None:
    response = await post(
        clients, model="broken", stream=True, messages=[{"role": "user", "content": "a b c"}]
    )
    events = events_of(response.text)
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["type"] == "overloaded_error"
    assert "message_stop" not in [event["type"] for event in events]


async def test_sdk_raises_typed_errors(clients: Clients) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        await clients.sdk.messages.create(
            model="alpha",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=0,
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "max_tokens" in bad.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as missing:
        await clients.sdk.messages.create(
            model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"stop_sequences": [f"s{i}" for i in range(17)]}, "stop_sequences"),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config"),
        ({"output_format": {"type": "json_schema"}}, "output_format"),
        ({"context_management": {"edits": []}}, "context_management"),
        ({"thinking": {"type": "enabled", "budget_tokens": 16}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"thinking": {"type": "adaptive", "display": "loud"}}, "thinking.display"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "thinking", "thinking": "x", "signature": "forged"}],
                    },
                    {"role": "user", "content": "go on"},
                ]
            },
            "messages[1].content[0].signature",
        ),
        ({"mcp_servers": [{"type": "url"}]}, "mcp_servers"),
        ({"container": "c1"}, "container"),
        ({"tools": [{"name": "x", "type": "web_search_20250305"}]}, "tools[0].type"),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ({"tools": [{"name": "x", "input_schema": {"type": 3}}]}, "tools[0].input_schema"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "y"}}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": 1}]},
                    {"role": "user", "content": "go on"},
                ]
            },
            "messages[1].content[0].name",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]},
            "messages[1]",
        ),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(
    clients: Clients, fields: dict[str, Any], names: str
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    if body.get("max_tokens", 16) is None:
        body.pop("max_tokens")
        response = await clients.http.post("/v1/messages", json={"model": "alpha", **body})
    else:
        response = await post(clients, **body)
    assert_error(response, 400, "invalid_request_error", names)


async def test_image_blocks_follow_the_backends_features(clients: Clients) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "what is it"}, image]},
    ]
    # A backend without image input: 400 naming the block, in this API's notation.
    response = await post(clients, model="plain", system="s", messages=messages)
    assert_error(response, 400, "invalid_request_error", "messages[2].content[1]")
    # One that declares it gets the image as a chat image_url part (a data URL).
    response = await post(clients, messages=messages)
    assert response.status_code == 200, response.text
    parts = clients.last_request().messages[-1].parts
    assert [part.type for part in parts] == ["text", "image_url"]
    assert orjson.loads(parts[1].json)["image_url"]["url"] == "data:image/png;base64,AA"
    # Tools on a backend that declares none: refused by its features, naming tools.
    response = await post(clients, model="plain", tools=[TOOL], messages=messages[:1])
    assert_error(response, 400, "invalid_request_error", "tools")
    bad = {"type": "image", "source": {"type": "file", "file_id": "f"}}
    response = await post(clients, messages=[{"role": "user", "content": [bad]}])
    assert_error(response, 400, "invalid_request_error", "messages[0].content[0].source")


async def test_door_errors_use_the_anthropic_envelope(clients: Clients) -> None:
    response = await clients.http.get("/v1/messages")
    assert_error(response, 405, "invalid_request_error", "GET")
    response = await clients.http.post(
        "/v1/messages", content=b"{", headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "invalid_request_error", "JSON")
    response = await clients.http.post("/v1/messages", content=b"x")
    assert_error(response, 415, "invalid_request_error", "application/json")
    response = await post(clients, "/v1/messages/count_tokens", model="nope", messages=[])
    assert_error(response, 400, "invalid_request_error", "messages")
    # Chat keeps OpenAI's envelope.
    chat = await clients.http.post("/v1/chat/completions", json={"model": "alpha"})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"


async def test_keys_come_as_x_api_key_or_bearer(clients: Clients) -> None:
    body = {"model": "alpha", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    headers = {
        "x-api-key": "",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "prompt-caching-2024-07-31",
    }
    response = await clients.http.post("/v1/messages", json=body, headers=headers)
    assert_error(response, 401, "authentication_error", "API key")
    headers["x-api-key"] = "sk-wrong"
    response = await clients.http.post("/v1/messages", json=body, headers=headers)
    assert_error(response, 401, "authentication_error", "Incorrect API key")
    headers["x-api-key"] = KEY  # anthropic-version and -beta are accepted and ignored
    response = await clients.http.post("/v1/messages", json=body, headers=headers)
    assert response.status_code == 200, response.text
    bearer = {"x-api-key": "", "authorization": f"Bearer {KEY}"}
    response = await clients.http.post("/v1/messages", json=body, headers=bearer)
    assert response.status_code == 200, response.text
    # The same key on the OpenAI routes, in their envelope.
    chat = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
    response = await clients.http.post("/v1/chat/completions", json=chat)
    assert response.status_code == 200, response.text
    response = await clients.http.post("/v1/chat/completions", json=chat, headers={"x-api-key": ""})
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


async def test_request_log_and_metrics_name_the_endpoint(
    clients: Clients, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        await post(clients, messages=[{"role": "user", "content": "hi"}])
        await post(
            clients, "/v1/messages/count_tokens", messages=[{"role": "user", "content": "a"}]
        )
        await post(clients, messages=[])
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == REQUEST_LOGGER]
    assert [(line["endpoint"], line["status"]) for line in lines] == [
        ("/v1/messages", "ok"),
        ("/v1/messages/count_tokens", "ok"),
        ("/v1/messages", "client_error"),
    ]
    text = (await clients.http.get("/metrics")).text
    for labels in (
        'endpoint="/v1/messages",model="alpha",status="ok"',
        'endpoint="/v1/messages/count_tokens",model="alpha",status="ok"',
        'endpoint="/v1/messages",model="unrouted",status="client_error"',
    ):
        assert re.search(
            r"^llmso_requests_total\{[^}]*" + re.escape(labels) + r"\} 1\.0$", text, re.M
        ), labels


async def test_openapi_documents_both_routes(clients: Clients) -> None:
    spec = (await clients.http.get("/openapi.json")).json()
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        post_op = spec["paths"][path]["post"]
        error = post_op["responses"]["400"]["content"]["application/json"]["schema"]
        assert error["$ref"].endswith("/AnthropicErrorResponse")
    assert "max_tokens" in spec["components"]["schemas"]["MessagesRequest"]["required"]
