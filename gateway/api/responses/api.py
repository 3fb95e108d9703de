"""``GET`` / ``DELETE /v1/responses/{id}`` and ``GET …/input_items``: stored responses."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from backends.base import InvalidRequest
from gateway.api.responses.render import item_resource
from gateway.api.responses.store import ResponseNotFound, ResponseStore

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


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    request: Request,
    order: str = Query("desc"),
    limit: int = Query(20),
    after: str | None = Query(None),
) -> Response:
    """The items the response was generated from (history included), as a cursor page."""
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    entry = await _store(request).get(response_id)
    if entry is None:
        raise _not_found(response_id)
    own_output = len(entry.response["output"])
    items = [item_resource(item) for item in entry.items[: len(entry.items) - own_output]]
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise InvalidRequest(f"no item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return _json(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )
