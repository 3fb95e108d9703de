"""OpenTelemetry tracing: one trace per request, client → gateway → engine.

``Tracing`` owns one app's ``TracerProvider`` (no global provider, no global propagator:
two apps in one process trace independently). It exists only when ``tracing.otlp_endpoint``
is set (or a test hands in an exporter); with tracing off nothing here is imported and a
request pays one ``is None`` test per hook.

Spans of one request (``RequestTrace``, owned by the task serving the request):

- ``POST /v1/chat/completions`` (SERVER), parent taken from the client's ``traceparent``;
- ``route {model}`` (INTERNAL): resolve the name and wait for the model's lease (a lazy
  load waits here);
- ``{operation} {model}`` (CLIENT), the backend call, with the OpenTelemetry GenAI
  attributes and the request timeline as events (``queued``, ``inference_start``,
  ``first_token``); its context is what upstreams receive as ``traceparent``.

Timestamps come from the ``RequestRecord`` at the end of the request, so the token path
has no tracing hook at all. Export goes through a ``BatchSpanProcessor``: its worker
thread, not the event loop, talks to the collector.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from backends.base import GenerationRequest, RequestKind
from config.tracing import TracingConfig
from gateway.observe.timing import queue_seconds
from gateway.observe.trace_context import trace_carrier

if TYPE_CHECKING:
    from gateway.observe.record import RequestRecord

_OPERATION = {RequestKind.CHAT: "chat", RequestKind.COMPLETION: "text_completion"}


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


def build_exporter(config: TracingConfig) -> SpanExporter:
    """The official OTLP exporter for the endpoint's scheme (imported only when used)."""
    endpoint = config.otlp_endpoint
    if endpoint is None:
        raise ValueError("tracing.otlp_endpoint is not set")
    if endpoint.startswith(("grpc://", "grpcs://")):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        secure = endpoint.startswith("grpcs://")
        target = endpoint.split("://", 1)[1]
        return GrpcExporter(endpoint=target, insecure=not secure, timeout=config.export_timeout)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=f"{endpoint}/v1/traces", timeout=config.export_timeout)


class Tracing:
    """One app's tracer provider and propagator; built by ``build_app``, shut down by its
    lifespan (which flushes what is still queued)."""

    def __init__(self, config: TracingConfig, exporter: SpanExporter | None = None) -> None:
        self.config = config
        self.provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            resource=Resource.create({"service.name": config.service_name}),
            shutdown_on_exit=False,
        )
        processor = BatchSpanProcessor(
            exporter or build_exporter(config),
            export_timeout_millis=config.export_timeout * 1000.0,
        )
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("llmso.gateway")
        self.propagator = TraceContextTextMapPropagator()

    def start_request(self, scope: MutableMapping[str, Any], request_id: str) -> RequestTrace:
        """Open the SERVER span of one HTTP request, child of the client's trace context."""
        carrier = trace_carrier(scope)
        parent = self.propagator.extract(carrier) if carrier else None
        return RequestTrace(self, scope["method"], scope["path"], request_id, parent)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        self.provider.shutdown()


class RequestTrace:
    """The spans of one request; owned (and only touched) by the task serving it."""

    __slots__ = ("_backend", "_operation", "_route", "_tracing", "server", "status_code")

    def __init__(
        self,
        tracing: Tracing,
        method: str,
        path: str,
        request_id: str,
        parent: Any,
    ) -> None:
        self._tracing = tracing
        self.server: Span = tracing.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": method,
                "url.path": path,
                "llmso.request_id": request_id,
            },
        )
        self._route: Span | None = None
        self._backend: Span | None = None
        self._operation = "chat"
        self.status_code: int | None = None

    def _child(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> Span:
        context = trace.set_span_in_context(self.server)
        return self._tracing.tracer.start_span(
            name, context=context, kind=kind, attributes=attributes
        )

    def requested(self, request: GenerationRequest) -> None:
        """The body is parsed: name the operation and start routing."""
        self._operation = _OPERATION[request.kind]
        sampling = request.sampling
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": self._operation,
            "gen_ai.request.model": request.model,
            "gen_ai.request.temperature": sampling.temperature,
            "gen_ai.request.top_p": sampling.top_p,
            "gen_ai.request.choice.count": sampling.n,
        }
        if sampling.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = sampling.max_tokens
        if sampling.seed is not None:
            attributes["gen_ai.request.seed"] = sampling.seed
        if sampling.stop:
            attributes["gen_ai.request.stop_sequences"] = list(sampling.stop)
        if self._tracing.config.capture_content:
            if request.messages:
                messages = [{"role": m.role, "content": m.content} for m in request.messages]
                attributes["gen_ai.input.messages"] = json.dumps(messages)
            else:
                attributes["gen_ai.prompt"] = request.prompt
        self.server.set_attributes(attributes)
        self._route = self._child(
            f"route {request.model}", SpanKind.INTERNAL, {"gen_ai.request.model": request.model}
        )

    def enter_backend(self, request: GenerationRequest, backend: str) -> GenerationRequest:
        """The model's lease is held: end routing, open the backend span, and return the
        request carrying that span's context for the upstream (``trace_headers``)."""
        if self._route is not None:
            self._route.set_attributes({"llmso.model": request.model, "llmso.backend": backend})
            self._route.end()
            self._route = None
        if self._backend is not None:  # the previous model of a fallback chain gave up
            self._backend.set_status(Status(StatusCode.ERROR, "fell back to the next model"))
            self._backend.end()
        self._backend = self._child(
            f"{self._operation} {request.model}",
            SpanKind.CLIENT,
            {
                "gen_ai.operation.name": self._operation,
                "gen_ai.request.model": request.model,
                "gen_ai.provider.name": "llmso",
                "llmso.backend": backend,
            },
        )
        carrier: dict[str, str] = {}
        self._tracing.propagator.inject(carrier, context=trace.set_span_in_context(self._backend))
        return replace(request, trace_headers=tuple(carrier.items()))

    def end(self, record: RequestRecord, end_time: float) -> None:
        """Close every span of the request from what its record saw."""
        if self._route is not None:
            self._route.end()
            self._route = None
        failed = record.status != "ok"
        status = (
            Status(StatusCode.ERROR, record.error_type or record.status)
            if failed
            else Status(StatusCode.UNSET)
        )
        response = _response_attributes(record)
        backend = self._backend
        if backend is not None:
            backend.set_attributes(response)
            for name, at in (
                ("queued", _queued_at(record)),
                ("inference_start", record.inference_start_time),
                ("first_token", record.first_token_time),
            ):
                if at is not None:
                    backend.add_event(name, timestamp=_ns(at))
            backend.set_status(status)
            backend.end(end_time=_ns(end_time))
            self._backend = None
        server = self.server
        server.set_attributes(response)
        if self.status_code is not None:
            server.set_attribute("http.response.status_code", self.status_code)
        if failed:
            server.set_attribute("error.type", record.error_type or record.status)
        server.set_status(status)
        server.end(end_time=_ns(end_time))


def _response_attributes(record: RequestRecord) -> dict[str, Any]:
    attributes: dict[str, Any] = {"llmso.status": record.status}
    if record.model:
        attributes["gen_ai.response.model"] = record.model
        attributes["gen_ai.usage.input_tokens"] = record.input_tokens
        attributes["gen_ai.usage.output_tokens"] = record.output_tokens
    if record.finish_reasons:
        attributes["gen_ai.response.finish_reasons"] = list(record.finish_reasons)
    if record.fallback_from:
        attributes["llmso.fallback_from"] = list(record.fallback_from)
    queued = queue_seconds(record)
    if queued is not None:
        attributes["llmso.queue_seconds"] = queued
    if record.first_token_time is not None:
        attributes["llmso.ttft_seconds"] = record.first_token_time - record.arrival_time
    if record.upstream_seconds is not None:
        attributes["llmso.upstream_seconds"] = record.upstream_seconds
    return attributes


def _queued_at(record: RequestRecord) -> float | None:
    start = record.queue_start_time
    if start is not None and record.routed_at is not None:
        return max(start, record.routed_at)
    return start
