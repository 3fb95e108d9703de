"""W3C trace-context headers, read without OpenTelemetry (tracing may be off).

With tracing off the gateway is a transparent hop for trace context: a client's
``traceparent``/``tracestate`` reach the upstream (vLLM, Triton) unchanged, so an engine
that traces still joins the client's trace. With tracing on, ``gateway.observe.tracing`` replaces
them with the context of the gateway's own backend span.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import replace
from typing import Any

from backends.base import GenerationRequest

TRACE_HEADERS = (b"traceparent", b"tracestate")


def trace_carrier(scope: MutableMapping[str, Any]) -> dict[str, str]:
    """The trace-context headers of an ASGI request, as ``{name: value}``."""
    return {
        bytes(key).decode("latin-1"): bytes(value).decode("latin-1")
        for key, value in scope["headers"]
        if key in TRACE_HEADERS
    }


def client_trace_headers(
    scope: MutableMapping[str, Any], request: GenerationRequest
) -> GenerationRequest:
    """``request`` carrying the client's trace-context headers, if it sent any."""
    carrier = trace_carrier(scope)
    if not carrier:
        return request
    return replace(request, trace_headers=tuple(carrier.items()))
