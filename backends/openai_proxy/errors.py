"""Map upstream failures onto the backend's typed errors.

- 4xx: ``UpstreamRejected`` with the upstream's status, message, param and code (a 400
  about the context window gets ``code="context_length_exceeded"``); 429 becomes
  ``Overloaded`` so the client sees Retry-After.
- 502/503 and connection failures (also a connection lost mid-stream):
  ``UpstreamUnavailable`` (503), retried while no event has reached the client.
- 504 and read timeouts: ``UpstreamTimeout`` (504).
- other 5xx and unparseable bodies or streams: ``UpstreamBadResponse`` (502).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from backends.base import (
    BackendError,
    Overloaded,
    UpstreamBadResponse,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from backends.openai_proxy import http1

_MAX_MESSAGE = 1000
_CONTEXT_HINTS = ("maximum context length", "context length", "context window", "too long")


def from_status(status: int, body: bytes, retry_after: str | None = None) -> BackendError:
    """The error for a non-200 upstream answer with raw ``body``."""
    message, param, code = _parse_error_body(body)
    message = message or f"upstream answered HTTP {status}"
    if status == 429:
        return Overloaded(f"upstream is overloaded: {message}", retry_after=_seconds(retry_after))
    if 400 <= status < 500:
        if code is None and status == 400 and _mentions_context(message):
            code = "context_length_exceeded"
        return UpstreamRejected(message, status=status, param=param, code=code)
    if status in (502, 503):
        return UpstreamUnavailable(f"upstream unavailable ({status}): {message}")
    if status == 504:
        return UpstreamTimeout(f"upstream timed out ({status}): {message}")
    return UpstreamBadResponse(f"upstream error ({status}): {message}")


def from_exception(exc: BaseException, *, url: str) -> BackendError:
    """The error for an exception raised by the HTTP client while talking to ``url``."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | http1.ConnectTimeout):
        return UpstreamUnavailable(f"cannot connect to {url}: connect timed out")
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"upstream {url} timed out")
    if isinstance(exc, aiohttp.ClientConnectorError | aiohttp.ServerDisconnectedError):
        return UpstreamUnavailable(f"cannot reach {url}: {exc}")
    if isinstance(exc, aiohttp.ClientPayloadError | http1.RemoteClosed):  # dropped mid-body
        return UpstreamUnavailable(f"lost the connection to {url} mid-stream: {exc}")
    if isinstance(exc, http1.ProtocolError):
        return UpstreamBadResponse(f"upstream {url} sent invalid HTTP: {exc}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamUnavailable(f"connection to {url} failed: {exc}")
    return UpstreamBadResponse(f"upstream {url} failed: {exc!r}")


def is_retryable(error: BackendError) -> bool:
    """Whether another attempt may succeed: the upstream was unreachable or busy."""
    return isinstance(error, UpstreamUnavailable | Overloaded)


def from_stream_error(payload: Any) -> BackendError:
    """The error for an ``{"error": ...}`` object sent inside an SSE stream."""
    message, _param, _code = _error_fields(payload)
    return UpstreamBadResponse(f"upstream failed mid-stream: {message or payload!r}")


def _parse_error_body(body: bytes) -> tuple[str, str | None, str | None]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:_MAX_MESSAGE], None, None
    return _error_fields(payload)


def _error_fields(payload: Any) -> tuple[str, str | None, str | None]:
    """``(message, param, code)`` from the shapes engines use: OpenAI's ``{"error":
    {...}}``, FastAPI's ``{"detail": ...}``, a bare ``{"message": ...}`` or a string."""
    if isinstance(payload, dict):
        inner = payload.get("error", payload)
        if isinstance(inner, str):
            return inner[:_MAX_MESSAGE], None, None
        if isinstance(inner, dict):
            message = inner.get("message") or inner.get("detail")
            param = inner.get("param")
            code = inner.get("code")
            return (
                _text(message)[:_MAX_MESSAGE],
                param if isinstance(param, str) else None,
                code if isinstance(code, str) else None,
            )
    return _text(payload)[:_MAX_MESSAGE], None, None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # FastAPI validation errors
        return "; ".join(
            str(item.get("msg", item)) if isinstance(item, dict) else str(item) for item in value
        )
    return str(value)


def _mentions_context(message: str) -> bool:
    lowered = message.lower()
    return any(hint in lowered for hint in _CONTEXT_HINTS) and "token" in lowered


def _seconds(value: str | None) -> float:
    try:
        return max(0.0, float(value)) if value else 1.0
    except ValueError:
        return 1.0
