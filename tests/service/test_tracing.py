"""Tracing: the span tree of one request, its GenAI attributes, errors, the client's
``traceparent``, what reaches an upstream, a real OTLP/HTTP export, and ``Server-Timing``.

The app runs in-process over ASGI with the SDK's in-memory exporter; the upstream tests
use the real ``openai`` backend against the in-process fake upstream over real HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from backends.base import BackendEvent, GenerationRequest, Overloaded
from bench.fake_upstream import FakeUpstream
from config.schema import AppConfig, ModelConfig
from config.tracing import TracingConfig
from gateway.app import build_app
from gateway.edge.asgi import GatewayASGI
from gateway.observe.tracing import build_exporter
from tests.tools.fake_backend import FakeBackend

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


class RecordingBackend(FakeBackend):
    """The fake backend, keeping every request it was handed; model ``echo`` is full when
    the prompt says ``busy-echo``."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.requests: list[GenerationRequest] = []

    def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.requests.append(request)
        if request.model == "echo" and "busy-echo" in request.messages[-1].content:
            return self._full()
        return super().generate(request)

    async def _full(self) -> AsyncIterator[BackendEvent]:
        raise Overloaded("echo is full")
        yield  # an async generator, like generate()


def _config(tracing: dict[str, Any] | None = None, **fallback: Any) -> AppConfig:
    models = [
        {"name": "echo", "backend": "openai", "base_url": "http://unused", **fallback},
        {"name": "spare", "backend": "openai", "base_url": "http://unused"},
    ]
    return AppConfig.model_validate({"models": models, "tracing": tracing or {}})


Client = tuple[httpx.AsyncClient, GatewayASGI, dict[str, RecordingBackend]]


@pytest.fixture
async def open_app() -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[Any, httpx.AsyncClient]] = []

    async def make(config: AppConfig, exporter: InMemorySpanExporter | None) -> Client:
        backends: dict[str, RecordingBackend] = {}

        def factory(model: ModelConfig, _on_crash: Any) -> RecordingBackend:
            backends[model.name] = RecordingBackend(model)
            return backends[model.name]

        app = build_app(config, backend_factory=factory, span_exporter=exporter)
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        await app.state.registry.start(wait=True)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        opened.append((lifespan, client))
        return client, app, backends

    yield make
    for lifespan, client in opened:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


def _spans(app: GatewayASGI, exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    assert app.state.tracing is not None
    assert app.state.tracing.force_flush()
    return {span.name: span for span in exporter.get_finished_spans()}


def _chat(content: str = "one two three", **extra: Any) -> dict[str, Any]:
    return {"model": "echo", "messages": [{"role": "user", "content": content}], **extra}


async def test_span_tree_attributes_and_propagation(open_app: Callable[..., Any]) -> None:
    exporter = InMemorySpanExporter()
    client, app, backends = await open_app(_config(), exporter)
    response = await client.post(
        "/v1/chat/completions",
        json=_chat(max_tokens=2, seed=7),
        headers={"traceparent": TRACEPARENT, "tracestate": "vendor=1"},
    )
    assert response.status_code == 200, response.text
    spans = _spans(app, exporter)
    assert set(spans) == {"POST /v1/chat/completions", "route echo", "chat echo"}
    server = spans["POST /v1/chat/completions"]
    route, call = spans["route echo"], spans["chat echo"]
    # One trace, rooted at the client's span.
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {TRACE_ID}
    assert server.parent is not None and format(server.parent.span_id, "016x") == CLIENT_SPAN
    assert route.parent is not None and route.parent.span_id == server.context.span_id
    assert call.parent is not None and call.parent.span_id == server.context.span_id
    assert (server.kind, route.kind, call.kind) == (
        SpanKind.SERVER,
        SpanKind.INTERNAL,
        SpanKind.CLIENT,
    )
    assert route.end_time is not None and call.start_time is not None
    assert route.end_time <= call.start_time
    attrs = dict(call.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "echo"
    assert attrs["gen_ai.response.model"] == "echo"
    assert attrs["gen_ai.usage.output_tokens"] == 2
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert "gen_ai.input.messages" not in dict(server.attributes or {})  # capture_content off
    assert dict(server.attributes or {})["gen_ai.request.seed"] == 7
    assert dict(server.attributes or {})["http.response.status_code"] == 200
    assert [e.name for e in call.events] == ["queued", "inference_start", "first_token"]
    assert server.status.status_code is StatusCode.UNSET
    # The backend got the backend span's context, with the client's tracestate kept.
    headers = dict(backends["echo"].requests[0].trace_headers)
    span_id = format(call.context.span_id, "016x")
    assert headers["traceparent"] == f"00-{TRACE_ID}-{span_id}-01"
    assert headers["tracestate"] == "vendor=1"


async def test_errors_mark_spans(open_app: Callable[..., Any]) -> None:
    exporter = InMemorySpanExporter()
    client, app, _ = await open_app(_config({"capture_content": True}), exporter)
    missing = await client.post("/v1/chat/completions", json={**_chat(), "model": "nope"})
    assert missing.status_code == 404
    spans = _spans(app, exporter)
    server = spans["POST /v1/chat/completions"]
    assert server.status.status_code is StatusCode.ERROR
    assert dict(server.attributes or {})["http.response.status_code"] == 404
    assert "chat nope" not in spans  # never reached a backend
    assert "server-timing" in missing.headers
    exporter.clear()

    midway = await client.post(
        "/v1/chat/completions",
        json=_chat("!error-after 1 UpstreamUnavailable - gone", stream=True),
    )
    assert midway.status_code == 200 and '"error"' in midway.text
    spans = _spans(app, exporter)
    for name in ("POST /v1/chat/completions", "chat echo"):
        assert spans[name].status.status_code is StatusCode.ERROR, name
    messages = dict(spans["POST /v1/chat/completions"].attributes or {})["gen_ai.input.messages"]
    assert "!error-after" in str(messages)  # capture_content on


async def test_fallback_ends_the_first_backend_span(open_app: Callable[..., Any]) -> None:
    exporter = InMemorySpanExporter()
    client, app, _ = await open_app(_config(fallback=["spare"]), exporter)
    response = await client.post("/v1/chat/completions", json=_chat("busy-echo", max_tokens=1))
    assert response.status_code == 200, response.text
    spans = _spans(app, exporter)
    assert spans["chat echo"].status.status_code is StatusCode.ERROR
    assert spans["chat spare"].status.status_code is StatusCode.UNSET
    server = dict(spans["POST /v1/chat/completions"].attributes or {})
    assert server["llmso.fallback_from"] == ("echo",)


async def test_tracing_off_relays_client_context(open_app: Callable[..., Any]) -> None:
    client, app, backends = await open_app(_config(), None)
    assert app.state.tracing is None
    response = await client.post(
        "/v1/chat/completions", json=_chat(max_tokens=1), headers={"traceparent": TRACEPARENT}
    )
    assert response.status_code == 200
    assert dict(backends["echo"].requests[0].trace_headers) == {"traceparent": TRACEPARENT}
    timing = response.headers["server-timing"]
    assert timing.startswith("load;dur=") and "queue;dur=" in timing and "ttft;dur=" in timing


async def test_traceparent_reaches_the_upstream() -> None:
    """The real openai backend over HTTP: the fake upstream sees the backend span's id."""
    exporter = InMemorySpanExporter()
    async with FakeUpstream() as fake:
        config = AppConfig.model_validate(
            {
                "models": [
                    {"name": "fake-model", "backend": "openai", "base_url": fake.url},
                ]
            }
        )
        app = build_app(config, span_exporter=exporter)
        async with app.lifespan():
            await app.state.registry.start(wait=True)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                body = {**_chat(max_tokens=3), "model": "fake-model"}
                response = await client.post(
                    "/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}
                )
            assert response.status_code == 200
            assert "upstream;dur=" in response.headers["server-timing"]
            spans = _spans(app, exporter)
    call = spans["chat fake-model"]
    seen = [h for h in fake.headers if "traceparent" in {k.lower() for k in h}]
    assert seen, fake.headers
    traceparent = {k.lower(): v for k, v in seen[-1].items()}["traceparent"]
    assert traceparent == f"00-{TRACE_ID}-{format(call.context.span_id, '016x')}-01"
    assert dict(call.attributes or {})["llmso.upstream_seconds"] > 0


async def test_otlp_http_export_reaches_a_collector() -> None:
    """The configured exporter POSTs protobuf to <endpoint>/v1/traces from its own thread."""
    received: list[ExportTraceServiceRequest] = []

    async def traces(request: web.Request) -> web.Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        received.append(message)
        return web.Response(body=b"", content_type="application/x-protobuf")

    collector = web.Application()
    collector.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(collector)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        config = _config({"otlp_endpoint": f"http://127.0.0.1:{port}"})
        app = build_app(config, backend_factory=lambda m, _c: FakeBackend(m))
        async with app.lifespan():
            await app.state.registry.start(wait=True)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                response = await client.post("/v1/chat/completions", json=_chat(max_tokens=1))
            assert response.status_code == 200
            assert app.state.tracing is not None
            # force_flush blocks on the exporter thread; keep the loop (the collector) free.
            assert await asyncio.to_thread(app.state.tracing.force_flush)
    finally:
        await runner.cleanup()
    names = {
        span.name
        for message in received
        for resource in message.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    }
    assert {"POST /v1/chat/completions", "route echo", "chat echo"} <= names


def test_endpoint_schemes_pick_the_exporter() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    http = build_exporter(TracingConfig(otlp_endpoint="http://collector:4318/"))
    assert isinstance(http, HttpExporter)
    assert http._endpoint == "http://collector:4318/v1/traces"
    grpc_exporter = build_exporter(TracingConfig(otlp_endpoint="grpc://collector:4317"))
    assert isinstance(grpc_exporter, GrpcExporter)
    grpc_exporter.shutdown()
    with pytest.raises(ValueError, match="otlp_endpoint"):
        TracingConfig(otlp_endpoint="collector:4318")


async def test_lazy_load_wait_is_in_the_route_span() -> None:
    """A model loading on first use: the wait shows in ``route`` and in ``Server-Timing``."""
    exporter = InMemorySpanExporter()
    config = AppConfig.model_validate(
        {
            "models": [
                {"name": "echo", "backend": "openai", "base_url": "http://x", "preload": False}
            ]
        }
    )
    app = build_app(
        config, backend_factory=lambda m, _c: FakeBackend(m, load_delay=0.2), span_exporter=exporter
    )
    async with app.lifespan():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post("/v1/chat/completions", json=_chat(max_tokens=1))
        assert response.status_code == 200
        spans = _spans(app, exporter)
    route = spans["route echo"]
    assert route.end_time is not None and route.start_time is not None
    assert route.end_time - route.start_time >= 200_000_000  # the 0.2 s load, in ns
    load_ms = float(response.headers["server-timing"].split("load;dur=")[1].split(",")[0])
    assert load_ms >= 200
