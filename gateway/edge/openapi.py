"""``/openapi.json`` for every route: FastAPI's own, plus the plain-ASGI generation
routes (``gateway.edge.asgi``), which FastAPI cannot see.

Each generation route is documented from its pydantic wire type (the request body), with
its JSON and SSE success responses and the error envelope (OpenAI's, or Anthropic's on
the Messages routes) for every refusal the gateway can give, so tools such as
schemathesis can exercise it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from gateway.errors import speaks_anthropic

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ERRORS = {
    "400": "Invalid request (`param` names the field).",
    "401": "Missing or unknown client key (`invalid_api_key`).",
    "403": "Host not allowed (`server.allowed_hosts`).",
    "404": "No such model, or one the key may not use (`model_not_found`).",
    "405": "Method not allowed.",
    "408": "The body did not arrive within `server.body_timeout`.",
    "413": "Body larger than `server.max_body_bytes`.",
    "415": "Body is not `application/json`.",
    "429": "Rate limited (`rate_limit_exceeded`), daily tokens spent (`insufficient_quota`), "
    "spend budget spent (`budget_exceeded`) or the model's queue is full; see `Retry-After`.",
    "500": "Internal error.",
    "502": "The upstream answered garbage.",
    "503": "Model loading or down, or the limit store is down under `deny`.",
    "504": "The upstream timed out.",
}


def document(app: FastAPI, routes: Mapping[str, tuple[type[BaseModel], str]]) -> None:
    """Make ``app.openapi()`` include ``routes`` (path -> (wire type, summary))."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        schemas["ErrorResponse"] = _ERROR
        schemas["AnthropicErrorResponse"] = _ANTHROPIC_ERROR
        components["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "api-key": {"type": "apiKey", "in": "header", "name": "api-key"},
            "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
        operation_ids: set[str] = set()
        for path, (wire, summary) in routes.items():
            body = wire.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(body.pop("$defs", {}))
            schemas[wire.__name__] = body
            envelope = "AnthropicErrorResponse" if speaks_anthropic(path) else "ErrorResponse"
            operation = _operation(wire.__name__, summary, envelope)
            # One wire type may serve several paths (/v1/rerank, /rerank): ids stay unique.
            if operation["operationId"] in operation_ids:
                operation["operationId"] += "_" + path.strip("/").replace("/", "_")
            operation_ids.add(operation["operationId"])
            schema["paths"][path] = {"post": operation}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _operation(name: str, summary: str, envelope: str) -> dict[str, Any]:
    error = {"application/json": {"schema": {"$ref": f"#/components/schemas/{envelope}"}}}
    responses: dict[str, Any] = {
        "200": {
            "description": "The answer; an SSE stream of chunks when `stream` is true.",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
            "headers": {
                "x-llmso-cost": {
                    "description": "The answer's cost in USD at the model's `pricing:` "
                    "(a decimal string; whole answers only, not streams).",
                    "schema": {"type": "string"},
                }
            },
        }
    }
    responses.update(
        {status: {"description": text, "content": error} for status, text in _ERRORS.items()}
    )
    return {
        "summary": summary,
        "operationId": name,
        "security": [{}, {"bearer": []}, {"api-key": []}, {"x-api-key": []}],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        },
        "responses": responses,
    }
