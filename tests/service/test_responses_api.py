"""``/v1/responses`` in-process over ASGI with a scripted backend: shapes and every stream
event validated against OpenAI's ``Response`` / ``ResponseStreamEvent`` schemas, the
translation onto the chat contract, the store, and every refusal naming its ``param``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from bench.fake_upstream import FakeUpstream
from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.schemas import validate
from tests.tools.scripted_responses import ScriptedBackend, scripted_factory
from tests.tools.sse import named_events


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    backends: dict[str, ScriptedBackend] = {}

    models = [
        {"name": n, "backend": "openai", "base_url": "http://unused"}
        for n in ("alpha", "broken", "plain")
    ]
    config = AppConfig.model_validate({"models": models, "responses": {"max_entries": 4}})
    app = build_app(config, backend_factory=scripted_factory(backends))
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        http.backends = backends  # type: ignore[attr-defined]
        yield http


def events_of(text: str) -> list[dict[str, Any]]:
    events = named_events(text)
    for event in events:
        validate("ResponseStreamEvent", event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    return events


def assert_error(response: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    validate("ErrorResponse", body)
    assert body["error"]["param"] == param
    return body


async def create(client: httpx.AsyncClient, **fields: Any) -> httpx.Response:
    return await client.post("/v1/responses", json={"model": "alpha", **fields})


async def test_text_response_shape(client: httpx.AsyncClient) -> None:
    response = await create(client, input="hello there world", metadata={"k": "v"}, user="u1")
    assert response.status_code == 200, response.text
    body = response.json()
    validate("Response", body)
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "completed" and body["model"] == "alpha"
    [message] = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["text"] == "hello there world"
    assert body["usage"]["input_tokens"] == 3 and body["usage"]["total_tokens"] == 6
    assert body["metadata"] == {"k": "v"} and body["user"] == "u1"
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    assert request.messages[-1].role == "user" and request.user == "u1"


async def test_instructions_items_and_sampling_reach_the_chat_contract(
    client: httpx.AsyncClient,
) -> None:
    items = [
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [{"type": "output_text", "text": "yo", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "user", "content": "again"},
    ]
    response = await create(
        client, input=items, instructions="sys", temperature=0, top_p=0.5, max_output_tokens=9
    )
    assert response.status_code == 200, response.text
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    roles = [message.role for message in request.messages]
    assert roles == ["system", "developer", "user", "assistant", "tool", "user"]
    assistant = request.messages[3]
    assert assistant.content == "yo" and assistant.tool_calls[0].name == "f"
    assert request.messages[4].tool_call_id == "c1" and request.messages[4].content == "42"
    assert request.sampling.temperature == 0 and request.sampling.top_p == 0.5
    assert request.sampling.max_tokens == 9


async def test_max_output_tokens_makes_it_incomplete(client: httpx.AsyncClient) -> None:
    body = (await create(client, input="one two three", max_output_tokens=2)).json()
    validate("Response", body)
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0]["text"] == "one two"


async def test_stream_events_in_openai_order(client: httpx.AsyncClient) -> None:
    response = await create(client, input="a b c", stream=True)
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    kinds = [event["type"] for event in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 3
    assert "".join(e["delta"] for e in events if e["type"].endswith("text.delta")) == "a b c"
    assert final["output"][0] == events[-2]["item"]
    assert len({event["response"]["id"] for event in (events[0], events[-1])}) == 1


async def test_tool_call_streams_as_function_call_item(client: httpx.AsyncClient) -> None:
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    arguments = '{"city":"Paris"}'
    response = await create(client, input=f"call weather {arguments}", tools=tools, stream=True)
    events = events_of(response.text)
    kinds = [event["type"] for event in events]
    assert kinds[2] == "response.output_item.added"
    assert set(kinds[3:-3]) == {"response.function_call_arguments.delta"}
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[-3]["arguments"] == arguments and events[-3]["name"] == "weather"
    [call] = events[-1]["response"]["output"]
    assert call["type"] == "function_call" and call["call_id"] == "call_1"
    assert call["arguments"] == arguments
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    assert request.tools[0].name == "weather" and request.tools[0].parameters


async def test_tool_call_non_streamed(client: httpx.AsyncClient) -> None:
    tools = [{"type": "function", "name": "f", "parameters": None, "strict": True}]
    body = (
        await create(client, input='call f {"a":1}', tools=tools, tool_choice="required")
    ).json()
    validate("Response", body)
    assert body["output"][0]["arguments"] == '{"a":1}'
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    assert request.tool_choice.mode == "required"


async def test_failure_mid_stream_is_response_failed(client: httpx.AsyncClient) -> None:
    response = await create(client, model="broken", input="x y z", stream=True)
    events = events_of(response.text)
    assert events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["output"][0]["status"] == "incomplete"


async def test_previous_response_id_continues_and_get_delete(client: httpx.AsyncClient) -> None:
    first = (await create(client, input="first turn", instructions="only once")).json()
    second = await create(client, input="second turn", previous_response_id=first["id"])
    assert second.status_code == 200
    validate("Response", second.json())
    assert second.json()["previous_response_id"] == first["id"]
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    assert [(m.role, m.content) for m in request.messages] == [
        ("user", "first turn"),
        ("assistant", "first turn"),
        ("user", "second turn"),
    ]
    fetched = await client.get(f"/v1/responses/{first['id']}")
    assert fetched.json() == first
    deleted = await client.delete(f"/v1/responses/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response.deleted", "deleted": True}
    assert_error(await client.get(f"/v1/responses/{first['id']}"), 404, None)
    assert_error(await client.delete(f"/v1/responses/{first['id']}"), 404, None)
    again = await create(client, input="x", previous_response_id=first["id"])
    assert_error(again, 404, "previous_response_id")


async def test_store_false_and_lru_bound(client: httpx.AsyncClient) -> None:
    unstored = (await create(client, input="x", store=False)).json()
    assert unstored["store"] is False
    assert_error(await client.get(f"/v1/responses/{unstored['id']}"), 404, None)
    ids = [(await create(client, input=f"n{i}")).json()["id"] for i in range(5)]
    assert (await client.get(f"/v1/responses/{ids[0]}")).status_code == 404  # max_entries 4
    assert (await client.get(f"/v1/responses/{ids[-1]}")).status_code == 200


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
        ),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": 5}}]},
            "tools[0].parameters",
        ),
        ({"background": True}, "background"),
        ({"include": ["file_search_call.results"]}, "include"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt": {"id": "p"}}, "prompt"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"input": []}, "input"),
        ({"temperature": 3}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ],
)
async def test_refusals_name_the_param(
    client: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    response = await create(client, **{"input": "hi", **fields})
    assert_error(response, 400, param)


async def test_json_schema_format_reaches_the_contract(client: httpx.AsyncClient) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    text = {"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}}
    body = (await create(client, input="x", text=text)).json()
    validate("Response", body)
    assert body["text"]["format"]["name"] == "thing"
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    assert request.response_format.type == "json_schema"
    assert request.response_format.schema == schema


async def test_backend_errors_name_responses_params(client: httpx.AsyncClient) -> None:
    too_long = await create(client, input="too long")
    assert assert_error(too_long, 400, "input")["error"]["code"] == "context_length_exceeded"
    text = {"format": {"type": "json_object"}}
    assert_error(await create(client, model="plain", input="x", text=text), 400, "text.format")
    tools = [{"type": "function", "name": "f"}]
    assert_error(await create(client, model="plain", input="x", tools=tools), 400, "tools")


async def test_output_text_logprobs_when_included(client: httpx.AsyncClient) -> None:
    fields = {"input": "a b", "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    body = (await create(client, **fields)).json()
    validate("Response", body)
    part = body["output"][0]["content"][0]
    assert [entry["token"] for entry in part["logprobs"]] == ["a", " b"]
    assert len(part["logprobs"][0]["top_logprobs"]) == 2 and body["top_logprobs"] == 2
    events = events_of((await create(client, **fields, stream=True)).text)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["logprobs"][0]["token"] for d in deltas] == ["a", " b"]
    request = client.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
    assert request.sampling.logprobs == 2


async def test_openai_upstream_gets_the_chat_translation() -> None:
    async with FakeUpstream() as upstream:
        model = {"name": "up", "backend": "openai", "base_url": upstream.url + "/v1"}
        model["upstream_model"] = "fake-model"
        app = build_app(AppConfig.model_validate({"models": [model]}))
        transport = httpx.ASGITransport(app=app)
        async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            fields = {"model": "up", "instructions": "sys", "max_output_tokens": 3}
            body = (await c.post("/v1/responses", json={**fields, "input": "hi"})).json()
            validate("Response", body)
            assert body["status"] == "incomplete" and body["usage"]["output_tokens"] == 3
            sent = upstream.bodies[-1]
            assert sent["messages"] == [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "hi"},
            ]
            assert sent["max_tokens"] == 3 and sent["model"] == "fake-model"
            stream = await c.post("/v1/responses", json={**fields, "input": "hi", "stream": True})
            events = events_of(stream.text)
            final = events[-1]["response"]
            assert events[-1]["type"] == "response.incomplete"
            assert final["output"][0]["content"] == body["output"][0]["content"]
            assert upstream.bodies[-1]["stream"] is True


async def test_input_items_list_the_whole_conversation(client: httpx.AsyncClient) -> None:
    first = (await create(client, input="one")).json()
    items = [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"role": "user", "content": [{"type": "input_text", "text": "two"}]},
    ]
    second = (await create(client, input=items, previous_response_id=first["id"])).json()
    listed = (await client.get(f"/v1/responses/{second['id']}/input_items?order=asc")).json()
    kinds = [(item["type"], item.get("role")) for item in listed["data"]]
    assert kinds == [
        ("message", "user"),
        ("message", "assistant"),
        ("function_call", None),
        ("function_call_output", None),
        ("message", "user"),
    ]
    assert listed["data"][1]["id"] == first["output"][0]["id"] and not listed["has_more"]
    url = f"/v1/responses/{second['id']}/input_items"
    page = (await client.get(url, params={"limit": 2})).json()
    assert page["has_more"] and page["data"][0]["content"][0]["text"] == "two"
    rest = (await client.get(url, params={"limit": 2, "after": page["last_id"]})).json()
    assert [item["type"] for item in rest["data"]] == ["function_call", "message"]
    again = (await client.get(url, params={"limit": 2})).json()
    assert again == page  # ids are stored, not made up per call
    assert_error(await client.get(url, params={"limit": 0}), 400, "limit")


async def test_interleaved_parallel_calls_keep_their_own_arguments(
    client: httpx.AsyncClient,
) -> None:
    tools = [{"type": "function", "name": "f"}]
    fields = {"input": "parallel f", "tools": tools, "parallel_tool_calls": True}
    events = events_of((await create(client, **fields, stream=True)).text)
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [(e["output_index"], e["arguments"]) for e in done] == [(0, '{"n":1}'), (1, '{"n":2}')]
    final = events[-1]["response"]["output"]
    assert [(item["call_id"], item["arguments"]) for item in final] == [
        ("call_a", '{"n":1}'),
        ("call_b", '{"n":2}'),
    ]
    body = (await create(client, **fields)).json()
    validate("Response", body)
    assert [item["arguments"] for item in body["output"]] == ['{"n":1}', '{"n":2}']
    assert client.backends["alpha"].calls[-1].parallel_tool_calls is True  # type: ignore[attr-defined]


async def test_openai_upstream_gets_tools_and_tool_turns_in_chat_shape() -> None:
    async with FakeUpstream() as upstream:
        model = {"name": "up", "backend": "openai", "base_url": upstream.url + "/v1"}
        app = build_app(
            AppConfig.model_validate({"models": [{**model, "upstream_model": "fake-model"}]})
        )
        transport = httpx.ASGITransport(app=app)
        async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
            body = {
                "model": "up",
                "input": [
                    {"role": "user", "content": "weather?"},
                    {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                ],
                "tools": [{"type": "function", "name": "w", "parameters": parameters}],
                "tool_choice": {"type": "function", "name": "w"},
                "text": {"format": {"type": "json_object"}},
                "max_output_tokens": 2,
            }
            assert (await c.post("/v1/responses", json=body)).status_code == 200
            sent = upstream.bodies[-1]
            assert sent["tools"] == [
                {"type": "function", "function": {"name": "w", "parameters": parameters}}
            ]
            assert sent["tool_choice"] == {"type": "function", "function": {"name": "w"}}
            assert sent["response_format"] == {"type": "json_object"}
            assistant, tool = sent["messages"][1:]
            assert assistant["tool_calls"][0]["id"] == "c1" and assistant["role"] == "assistant"
            assert tool == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}


def test_responses_config_refuses_an_unknown_store() -> None:
    models = [{"name": "m", "backend": "openai", "base_url": "http://unused"}]
    for store in ("redis://h:6379/0", "rediss://h/1", "unix:///run/redis.sock", "memory"):
        parsed = AppConfig.model_validate({"models": models, "responses": {"store": store}})
        assert parsed.responses.store == store
    for bad in ({"store": "mysql://h"}, {"ttl": 0}, {"max_entries": 0}):
        with pytest.raises(ValidationError):
            AppConfig.model_validate({"models": models, "responses": bad})


def test_responses_store_defaults_to_the_limits_store() -> None:
    from gateway.api.responses.redis_store import RedisResponseStore
    from gateway.api.responses.store import MemoryResponseStore
    from gateway.api.responses.stores import open_store

    models = [{"name": "m", "backend": "openai", "base_url": "http://unused"}]
    shared = AppConfig.model_validate({"models": models, "limits": {"store": "redis://h:1/0"}})
    assert shared.responses.store is None
    assert isinstance(open_store(shared.responses, shared.limits.store), RedisResponseStore)
    local = AppConfig.model_validate(
        {"models": models, "limits": {"store": "redis://h:1/0"}, "responses": {"store": "memory"}}
    )
    assert isinstance(open_store(local.responses, local.limits.store), MemoryResponseStore)
