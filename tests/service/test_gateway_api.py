"""Service tier: the whole app in-process with scripted backends, over ASGI.

Covers the OpenAI surface (shapes validated against the official schemas), the error
envelope for each failure, streaming framing, fallback, catalogue, health and metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest

from backends.base import (
    Backend,
    BackendEvent,
    ContextLengthExceeded,
    Finished,
    GenerationRequest,
    ModelInfo,
    NotReady,
    Overloaded,
    RequestKind,
    Started,
    TextDelta,
    UpstreamUnavailable,
    Usage,
)
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app
from tests.tools.schemas import validate

ADMIN_KEY = "secret-admin"


class ScriptedBackend:
    """Answers with the words of a fixed reply, or raises what its model name asks for."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name
        self.started = False
        self.calls: list[GenerationRequest] = []

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def ready(self) -> bool:
        return self.started

    def info(self) -> ModelInfo:
        return ModelInfo(max_context=64, memory_bytes=1000)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.calls.append(request)
        if self.name.startswith("busy"):
            raise Overloaded("queue full", retry_after=2)
        if self.name.startswith("cold"):
            raise NotReady("still loading", retry_after=3)
        if self.name.startswith("down"):
            raise UpstreamUnavailable("upstream down")
        if request.kind is RequestKind.CHAT and request.messages[-1].content == "too long":
            raise ContextLengthExceeded("prompt is 70 tokens, context is 64", param="messages")
        yield Started(queued_at=1.0, started_at=1.5)
        words = ["Hello", " from", f" {self.name}"][: request.sampling.max_tokens]
        for index in range(request.sampling.n):
            for word in words:
                yield TextDelta(index=index, text=word)
            if self.name.startswith("broken"):
                raise UpstreamUnavailable("lost the upstream mid-stream")
            length = len(words) == request.sampling.max_tokens
            yield Finished(index=index, reason="length" if length else "stop")
        yield Usage(prompt_tokens=5, completion_tokens=len(words) * request.sampling.n)


def config(*names: str, **extra: Any) -> AppConfig:
    models = [
        {"name": name, "backend": "openai", "base_url": "http://unused", **extra.get(name, {})}
        for name in names
    ]
    return AppConfig.model_validate({"models": models})


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., Any]]:
    stacks: list[Any] = []

    async def make(app_config: AppConfig, admin_key: str | None = None) -> httpx.AsyncClient:
        backends: dict[str, ScriptedBackend] = {}

        def factory(model: ModelConfig, _on_crash: Any) -> Backend:
            backends[model.name] = ScriptedBackend(model)
            return backends[model.name]

        app = build_app(app_config, admin_key=admin_key, backend_factory=factory)
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        client.backends = backends  # type: ignore[attr-defined]
        stacks.append((lifespan, client))
        return client

    yield make
    for lifespan, client in stacks:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


@pytest.fixture
async def client(client_for: Callable[..., Any]) -> httpx.AsyncClient:
    app_config = config(
        "alpha",
        "beta",
        "busy-one",
        "broken",
        alpha={"aliases": ["a"], "capabilities": ["small"]},
        **{"busy-one": {"fallback": ["alpha"]}},
    )
    made: httpx.AsyncClient = await client_for(app_config, ADMIN_KEY)
    return made


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": "alpha", "messages": [{"role": "user", "content": "hi"}], **fields}


def sse_events(text: str) -> list[Any]:
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else orjson.loads(data))
    return events


def assert_error(
    response: httpx.Response, status: int, code: str | None, param: str | None
) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == code
    assert body["error"]["param"] == param


# --------------------------------------------------------------------------- happy paths


async def test_chat_completion_shape(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(max_tokens=10))
    assert response.status_code == 200
    body = response.json()
    validate("CreateChatCompletionResponse", body)
    assert body["id"].startswith("chatcmpl-")
    assert body["model"] == "alpha"
    assert body["choices"][0]["message"]["content"] == "Hello from alpha"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert len(response.headers["x-request-id"]) == 32
    assert "total;dur=" in response.headers["server-timing"]


async def test_request_id_is_echoed_and_alias_answers_as_canonical(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json=chat_body(model="a", max_tokens=2),
        headers={"X-Request-ID": "my-id-1"},
    )
    assert response.headers["x-request-id"] == "my-id-1"
    assert response.json()["model"] == "alpha"
    assert response.json()["choices"][0]["finish_reason"] == "length"


async def test_chat_stream_framing(client: httpx.AsyncClient) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True}, n=2)
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert [c["choices"][0]["delta"].get("role") for c in chunks[:2]] == ["assistant"] * 2
    texts: dict[int, str] = {0: "", 1: ""}
    finishes = {}
    for chunk in chunks[2:-1]:
        choice = chunk["choices"][0]
        texts[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert texts == {0: "Hello from alpha", 1: "Hello from alpha"}
    assert finishes == {0: "stop", 1: "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


async def test_stream_without_usage_has_no_usage_chunk(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(stream=True))
    chunks = sse_events(response.text)[:-1]
    assert all("usage" not in chunk for chunk in chunks)


async def test_completions_plain_and_stream(client: httpx.AsyncClient) -> None:
    body = {"model": "beta", "prompt": "Once", "max_tokens": 5}
    plain = await client.post("/v1/completions", json=body)
    validate("CreateCompletionResponse", plain.json())
    assert plain.json()["id"].startswith("cmpl-")
    assert plain.json()["choices"][0]["text"] == "Hello from beta"
    streamed = await client.post(
        "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert text == "Hello from beta"
    for event in events[:-1]:
        validate("CreateCompletionResponse", event)


# --------------------------------------------------------------------------- errors


async def test_invalid_json_and_body_types(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_error(response, 400, None, None)
    assert_error(await client.post("/v1/chat/completions", json=[1, 2]), 400, None, None)


async def test_validation_error_names_param(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(temperature=5))
    assert_error(response, 400, None, "temperature")
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(model="nope"))
    assert_error(response, 404, "model_not_found", "model")


async def test_body_too_large_is_413(client_for: Callable[..., Any]) -> None:
    small = AppConfig.model_validate(
        {
            "server": {"max_body_bytes": 200},
            "models": [{"name": "alpha", "backend": "openai", "base_url": "http://x"}],
        }
    )
    client = await client_for(small)
    response = await client.post("/v1/chat/completions", json=chat_body(user="x" * 500))
    assert_error(response, 413, "request_too_large", None)


async def test_context_length_exceeded(client: httpx.AsyncClient) -> None:
    body = chat_body(messages=[{"role": "user", "content": "too long"}])
    response = await client.post("/v1/chat/completions", json=body)
    assert_error(response, 400, "context_length_exceeded", "messages")


async def test_unsupported_parameter_is_refused(client: httpx.AsyncClient) -> None:
    # The fake backend declares no tools, json modes or image input: each is refused by name.
    tool = {"type": "function", "function": {"name": "f"}}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    for fields, param in (
        ({"tools": [tool]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0]"),
    ):
        response = await client.post("/v1/chat/completions", json=chat_body(**fields))
        assert_error(response, 400, "unsupported_feature", param)


@pytest.mark.parametrize(
    ("model", "status", "code", "retry_after"),
    [("busy-x", 429, "overloaded", "2"), ("cold", 503, "model_not_ready", "3")],
)
async def test_overload_and_not_ready_carry_retry_after(
    client_for: Callable[..., Any], model: str, status: int, code: str, retry_after: str
) -> None:
    client = await client_for(config(model))
    response = await client.post("/v1/chat/completions", json=chat_body(model=model))
    assert_error(response, status, code, None)
    assert response.headers["retry-after"] == retry_after


async def test_mid_stream_failure_is_one_error_event_then_done(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/chat/completions", json=chat_body(model="broken", stream=True)
    )
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    errors = [event for event in events[:-1] if "error" in event]
    assert len(errors) == 1
    validate("ErrorResponse", errors[0])
    assert errors[0]["error"]["code"] == "upstream_unavailable"


async def test_unknown_route_and_method_use_envelope(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404, "not_found", None)
    assert_error(await client.get("/v1/chat/completions"), 405, "method_not_allowed", None)


# --------------------------------------------------------------------------- routing


async def test_fallback_answers_with_the_next_model(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=chat_body(model="busy-one"))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "alpha"
    metrics = (await client.get("/metrics")).text
    assert "llmso_route_decisions_total" in metrics


async def test_models_catalogue(client: httpx.AsyncClient) -> None:
    listing = (await client.get("/v1/models")).json()
    validate("ListModelsResponse", listing)
    ids = [model["id"] for model in listing["data"]]
    assert ids == ["alpha", "beta", "busy-one", "broken"]  # aliases not listed twice
    one = await client.get("/v1/models/a")
    validate("Model", one.json())
    assert one.json()["id"] == "alpha"
    assert_error(await client.get("/v1/models/missing"), 404, "model_not_found", "model")


# --------------------------------------------------------------------------- operations


async def test_health_ready_and_metrics(client: httpx.AsyncClient) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    ready = await client.get("/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
    await client.post("/v1/chat/completions", json=chat_body(stream=True))
    await client.post("/v1/chat/completions", json=chat_body(model="nope"))
    text = (await client.get("/metrics")).text
    for family in (
        "llmso_requests_total",
        "llmso_request_duration_seconds",
        "llmso_time_to_first_token_seconds",
        "llmso_inter_token_latency_seconds",
        "llmso_queue_time_seconds",
        "llmso_prompt_tokens_total",
        "llmso_generation_tokens_total",
        "llmso_inflight_requests",
        "llmso_worker_batch_size",
        "llmso_worker_queue_depth",
        "llmso_model_state",
    ):
        assert f"# TYPE {family}" in text, family
    ok = 'backend="openai",endpoint="/v1/chat/completions",model="alpha",status="ok"'
    assert f"llmso_requests_total{{{ok}}} 1.0" in text
    assert 'llmso_inflight_requests{backend="openai",model="alpha"} 0.0' in text


async def test_admin_routes_need_the_key(
    client: httpx.AsyncClient, client_for: Callable[..., Any]
) -> None:
    assert_error(await client.get("/admin/models"), 401, "invalid_api_key", None)
    auth = {"Authorization": f"Bearer {ADMIN_KEY}"}
    listing = (await client.get("/admin/models", headers=auth)).json()
    assert {m["name"] for m in listing["models"]} == {"alpha", "beta", "busy-one", "broken"}
    unloaded = await client.post("/admin/models/beta/unload", headers=auth)
    assert unloaded.json()["state"] == "unloaded"
    loaded = await client.post("/admin/models/beta/load", headers=auth)
    assert loaded.json()["state"] == "ready"
    no_admin = await client_for(config("alpha"))
    assert (await no_admin.get("/admin/models")).status_code == 200  # auth off: views open
    assert_error(await no_admin.post("/admin/models/alpha/unload"), 404, "not_found", None)


async def test_concurrent_requests_each_get_their_own_answer(client: httpx.AsyncClient) -> None:
    async def ask(model: str) -> str:
        response = await client.post("/v1/chat/completions", json=chat_body(model=model))
        content: str = response.json()["choices"][0]["message"]["content"]
        return content

    answers = await asyncio.gather(*(ask(m) for m in ["alpha", "beta"] * 10))
    assert answers == ["Hello from alpha", "Hello from beta"] * 10
