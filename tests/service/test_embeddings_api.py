"""Service tier for /v1/embeddings: the app in-process over ASGI with a scripted
embedder beside a scripted chat model; the refusals, input forms and the body shape."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from backends.base import Backend, BackendEvent, Feature, GenerationRequest, ModelInfo
from backends.embeddings import EmbeddingRequest, EmbeddingResult
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app
from tests.service.test_gateway_api import ScriptedBackend, assert_error
from tests.tools.schemas import validate


class ScriptedEmbedder:
    """Vector i of a request is (len(input i), index i, 1), so order can be checked."""

    def __init__(self, config: ModelConfig) -> None:
        self.requests: list[EmbeddingRequest] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ready(self) -> bool:
        return True

    def info(self) -> ModelInfo:
        return ModelInfo(features=frozenset({Feature.EMBEDDINGS}))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        raise AssertionError("the gateway must not send generation to an embedder")
        yield  # pragma: no cover

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        self.requests.append(request)
        items = request.texts or request.token_ids
        vectors = tuple((float(len(item)), float(i), 1.0) for i, item in enumerate(items))
        return EmbeddingResult(vectors, prompt_tokens=sum(len(item) for item in items))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = AppConfig.model_validate(
        {
            "models": [
                {"name": "embedder", "aliases": ["e"], "backend": "openai", "base_url": "http://x"},
                {"name": "chatter", "backend": "openai", "base_url": "http://x"},
            ]
        }
    )

    def factory(model: ModelConfig, _on_crash: Any) -> Backend:
        if model.name == "embedder":
            return ScriptedEmbedder(model)  # type: ignore[return-value]
        return ScriptedBackend(model)

    app = build_app(config, backend_factory=factory)
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as made,
    ):
        yield made


async def embed(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/embeddings", json={"model": "e", **body})


async def test_input_forms_and_body(client: httpx.AsyncClient) -> None:
    for value, lengths in (
        ("hello", [5]),
        (["a", "bcd"], [1, 3]),
        ([1, 2, 3, 4], [4]),
        ([[1], [2, 3]], [1, 2]),
    ):
        response = await embed(client, input=value, encoding_format="float")
        assert response.status_code == 200, response.text
        body = response.json()
        validate("CreateEmbeddingResponse", body)
        assert body["model"] == "embedder"
        assert [item["embedding"][0] for item in body["data"]] == lengths
        assert [item["index"] for item in body["data"]] == list(range(len(lengths)))
        assert body["usage"]["prompt_tokens"] == sum(lengths)


async def test_base64_and_dimensions_reach_the_backend(client: httpx.AsyncClient) -> None:
    response = await embed(client, input=["ab"], encoding_format="base64", dimensions=3)
    raw = response.json()["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(raw), dtype="<f4").tolist() == [2.0, 0.0, 1.0]


async def test_refusals_name_the_param(client: httpx.AsyncClient) -> None:
    chat_model = await client.post("/v1/embeddings", json={"model": "chatter", "input": "x"})
    assert_error(chat_model, 400, "unsupported_feature", "input")
    assert "does not support embeddings" in chat_model.json()["error"]["message"]
    chat = await client.post(
        "/v1/chat/completions",
        json={"model": "e", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert_error(chat, 400, "unsupported_feature", "messages")
    completion = await client.post("/v1/completions", json={"model": "e", "prompt": "hi"})
    assert_error(completion, 400, "unsupported_feature", "prompt")
    assert_error(await embed(client, input=[]), 400, None, "input")
    assert_error(await embed(client, input=["a", ""]), 400, None, "input[1]")
    assert_error(await embed(client, input=[[1], [-1]]), 400, None, "input[1]")
    assert_error(
        await embed(client, input="a", encoding_format="hex"), 400, None, "encoding_format"
    )
    assert_error(await embed(client, input="a", dimensions=0), 400, None, "dimensions")
    assert_error(await embed(client, input=[1.5]), 400, None, "input")
    missing = await client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
    assert_error(missing, 404, "model_not_found", "model")
    wrong_method = await client.get("/v1/embeddings")
    assert wrong_method.status_code == 405


async def test_client_key_limits_and_models_hold_for_embeddings() -> None:
    key = "sk-embed-test-key"
    config = AppConfig.model_validate(
        {
            "models": [
                {"name": "embedder", "backend": "openai", "base_url": "http://x"},
                {"name": "chatter", "backend": "openai", "base_url": "http://x"},
            ],
            "auth": {
                "required": True,
                "keys": [{"name": "rag", "key": key, "models": ["embedder"], "rpm": 2}],
            },
        }
    )

    def factory(model: ModelConfig, _on_crash: Any) -> Backend:
        if model.name == "embedder":
            return ScriptedEmbedder(model)  # type: ignore[return-value]
        return ScriptedBackend(model)

    app = build_app(config, backend_factory=factory)
    auth = {"authorization": f"Bearer {key}"}
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
    ):
        body = {"model": "embedder", "input": ["a", "b"]}
        assert (await http.post("/v1/embeddings", json=body)).status_code == 401
        answers = [await http.post("/v1/embeddings", json=body, headers=auth) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert answers[0].headers["x-ratelimit-limit-requests"] == "2"
        assert answers[2].json()["error"]["code"] == "rate_limit_exceeded"
        other = {"model": "chatter", "input": "a"}
        hidden = await http.post("/v1/embeddings", json=other, headers=auth)
        assert hidden.status_code == 404
        assert hidden.json()["error"]["code"] == "model_not_found"
