"""The endpoint seam (``gateway.api.base``): a new endpoint is one ``Endpoint`` subclass
registered in the list the app hands ``GatewayASGI``; the edge then gives it the same
front door, body limit, request record, error rendering and ``/openapi.json`` entry as
the built-in ones."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
from pydantic import BaseModel, Field

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams
from config.schema import AppConfig, ModelConfig
from gateway.api.base import Endpoint, GenerationPresenter, Prepared, parse_wire
from gateway.app import build_app
from gateway.edge.asgi import GatewayASGI
from gateway.observe.record import RequestRecord
from gateway.service.generation import CompletionService, Generation
from tests.service.test_gateway_api import ScriptedBackend, assert_error


class ShoutWire(BaseModel):
    model: str = Field(min_length=1)
    say: str = Field(min_length=1)


class ShoutPresenter(GenerationPresenter):
    """The model's whole answer, upper-cased, as ``{"shout": ...}``."""

    async def body(self, generation: Generation) -> bytes:
        done = await self.service.complete(generation)
        return orjson.dumps({"shout": done["choices"][0]["message"]["content"].upper()})

    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        return self.service.stream(generation, False)


class ShoutEndpoint(Endpoint):
    path = "/v1/shout"
    wire = ShoutWire
    summary = "Shout"

    def __init__(self, service: CompletionService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Generation]:
        wire = parse_wire(ShoutWire, body)
        request = GenerationRequest(
            request_id=record.request_id,
            model=wire.model,
            kind=RequestKind.CHAT,
            sampling=SamplingParams(max_tokens=8),
            messages=(ChatMessage(role="user", content=wire.say),),
            arrival_time=record.arrival_time,
        )
        return Prepared(request, False, ShoutPresenter(self._service))


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = AppConfig.model_validate(
        {"models": [{"name": "m", "backend": "openai", "base_url": "http://x"}]}
    )

    def factory(model: ModelConfig, _on_crash: Any) -> ScriptedBackend:
        return ScriptedBackend(model)

    built = build_app(config, backend_factory=factory)  # type: ignore[arg-type]
    app = GatewayASGI(built.api, built.state, [ShoutEndpoint(built.state.service)])
    async with (
        built.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as made,
    ):
        yield made


async def test_a_registered_endpoint_is_served_by_the_edge(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/shout", json={"model": "m", "say": "hi"})
    assert response.status_code == 200, response.text
    shout = response.json()["shout"]
    assert shout and shout == shout.upper()
    assert response.headers["x-request-id"]
    assert "total;dur=" in response.headers["server-timing"]
    stats = (await client.get("/admin/stats")).json()
    assert stats["models"]["m"]["requests"] >= 1


async def test_its_errors_are_the_edges(client: httpx.AsyncClient) -> None:
    assert_error(await client.post("/v1/shout", json={"model": "m"}), 400, None, "say")
    assert_error(
        await client.post("/v1/shout", json={"model": "nope", "say": "x"}),
        404,
        "model_not_found",
        "model",
    )
    assert (await client.get("/v1/shout")).status_code == 405
