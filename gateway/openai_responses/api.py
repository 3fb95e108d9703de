"""``GET`` and ``DELETE /v1/responses/{id}``: read and remove a stored response."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.openai_responses.store import ResponseNotFound, ResponseStore

router = APIRouter()


def _store(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.llmso.responses.store
    return store


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _not_found(response_id: str) -> ResponseNotFound:
    return ResponseNotFound(f"Response with id '{response_id}' not found.")


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Response:
    entry = await _store(request).get(response_id)
    if entry is None:
        raise _not_found(response_id)
    return _json(entry.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> Response:
    if not await _store(request).delete(response_id):
        raise _not_found(response_id)
    return _json({"id": response_id, "object": "response.deleted", "deleted": True})
