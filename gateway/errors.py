"""Errors at the HTTP edge and the one place that renders them.

Every error the gateway can return is an ``ApiError`` (``backends.errors``): a
``BackendError`` of the backend contract, or one of the HTTP-only errors defined here,
so a single handler maps ``status``, ``error_type``, ``code``, ``param`` and
``retry_after`` to a response. The envelope is the API's the path belongs to, decided
here once (``error_body``): Anthropic's on ``/v1/messages*`` (``anthropic_payload``),
OpenAI's everywhere else.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from backends.errors import ApiError, BackendError, InvalidRequest, Overloaded

log = logging.getLogger(__name__)


class HttpError(ApiError):
    """A client error Starlette raised with a status of its own."""

    status = 400
    error_type = "invalid_request_error"


class RequestTooLarge(ApiError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class Unauthorized(ApiError):
    status = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class HostNotAllowed(ApiError):
    """The ``Host`` header names a host this gateway does not serve (DNS rebinding)."""

    status = 403
    error_type = "permission_error"
    code = "host_not_allowed"


class RouteNotFound(ApiError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ApiError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(ApiError):
    """The request body did not arrive within ``server.body_timeout``."""

    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class UnsupportedMediaType(ApiError):
    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_media_type"


class GatewaySaturated(ApiError):
    """This gateway process serves ``server.max_in_flight`` requests already, or its
    event loop runs past ``server.shed_loop_lag_ms`` late: shed, so the admitted ones keep
    their pace (``gateway.edge.door``)."""

    status = 503
    error_type = "service_unavailable"
    code = "gateway_saturated"
    retry_after = 1.0


class InternalError(ApiError):
    status = 500
    error_type = "server_error"
    code = "internal_error"


def error_payload(exc: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": exc.message,
            "type": exc.error_type,
            "param": exc.param,
            "code": exc.code,
        }
    }


ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def speaks_anthropic(path: str) -> bool:
    """Whether ``path`` belongs to the Anthropic Messages API (its errors' envelope)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def anthropic_payload(exc: ApiError) -> dict[str, Any]:
    """Anthropic's envelope: its error type follows the status (a full queue is
    ``overloaded_error``); its message names the field, as it has no ``param``."""
    if isinstance(exc, Overloaded):
        kind = "overloaded_error"
    else:
        default = "api_error" if exc.status >= 500 else "invalid_request_error"
        kind = _ANTHROPIC_TYPES.get(exc.status, default)
    message = exc.message
    if exc.param and exc.param not in message:
        message = f"{exc.param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(exc: ApiError, path: str = "") -> tuple[bytes, dict[str, str]]:
    """The envelope's bytes for an error on ``path`` and the headers it needs
    (``Retry-After`` when known)."""
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    payload = anthropic_payload(exc) if speaks_anthropic(path) else error_payload(exc)
    return orjson.dumps(payload), headers


def error_response(exc: ApiError, path: str = "") -> Response:
    body, extra = error_body(exc, path)
    return Response(
        body,
        status_code=exc.status,
        media_type="application/json",
        headers=extra,
    )


def from_validation_error(exc: ValidationError) -> InvalidRequest:
    """The first pydantic error as an OpenAI 400, with ``param`` as a dotted path."""
    first = exc.errors()[0]
    loc = [str(part) for part in first["loc"] if not str(part).startswith(("function-", "union"))]
    param = _dotted(loc) or None
    message = first["msg"]
    if param:
        message = f"{param}: {message}"
    return InvalidRequest(message, param=param)


def _dotted(parts: list[str]) -> str:
    out = ""
    for part in parts:
        if part.isdigit():
            out += f"[{part}]"
        elif part in {
            "str",
            "list[str]",
            "list[int]",
            "list[list[int]]",
            "TextPart",
            "ContentPart",
        }:
            continue
        else:
            out += f".{part}" if out else part
    return out


async def handle_backend_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc, request.url.path)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    mapped: ApiError
    if exc.status_code == 404:
        mapped = RouteNotFound(f"no route for {request.method} {request.url.path}")
    elif exc.status_code == 405:
        mapped = MethodNotAllowed(f"method {request.method} not allowed on {request.url.path}")
    elif exc.status_code < 500:
        mapped = HttpError(str(exc.detail), status=exc.status_code)
    else:
        mapped = ApiError(str(exc.detail), status=exc.status_code)
    return error_response(mapped, request.url.path)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(InternalError("internal server error"), request.url.path)


__all__ = [
    "ApiError",
    "BackendError",
    "GatewaySaturated",
    "HttpError",
    "InternalError",
    "MethodNotAllowed",
    "RequestTooLarge",
    "RouteNotFound",
    "Unauthorized",
    "anthropic_payload",
    "error_body",
    "error_payload",
    "error_response",
    "from_validation_error",
    "handle_backend_error",
    "handle_http_exception",
    "handle_unexpected",
    "speaks_anthropic",
]
