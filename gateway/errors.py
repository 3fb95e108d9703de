"""Errors at the HTTP edge and the one place that renders them as OpenAI envelopes.

Every error the gateway can return is an ``ApiError`` (``backends.errors``): a
``BackendError`` of the backend contract, or one of the HTTP-only errors defined here,
so a single handler maps ``status``, ``error_type``, ``code``, ``param`` and
``retry_after`` to a response.
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

from backends.errors import ApiError, BackendError, InvalidRequest

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


class RouteNotFound(ApiError):
    status = 404
    error_type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ApiError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


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


def error_body(exc: ApiError) -> tuple[bytes, dict[str, str]]:
    """The envelope's bytes and the headers it needs (``Retry-After`` when known)."""
    headers: dict[str, str] = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return orjson.dumps(error_payload(exc)), headers


def error_response(exc: ApiError, headers: dict[str, str] | None = None) -> Response:
    body, extra = error_body(exc)
    return Response(
        body,
        status_code=exc.status,
        media_type="application/json",
        headers={**(headers or {}), **extra},
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
    return error_response(exc)


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
    return error_response(mapped)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(InternalError("internal server error"))


__all__ = [
    "ApiError",
    "BackendError",
    "HttpError",
    "InternalError",
    "MethodNotAllowed",
    "RequestTooLarge",
    "RouteNotFound",
    "Unauthorized",
    "error_body",
    "error_payload",
    "error_response",
    "from_validation_error",
    "handle_backend_error",
    "handle_http_exception",
    "handle_unexpected",
]
