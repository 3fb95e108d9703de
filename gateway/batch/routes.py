"""``/v1/files`` and ``/v1/batches``: OpenAI's Files and Batch APIs, as plain FastAPI
routes (they carry no tokens). Every object belongs to the client key that made it; a
key sees only its own. Errors are ``ApiError``s, rendered in OpenAI's envelope by the
app's one handler.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from starlette.datastructures import UploadFile
from starlette.responses import Response

from backends.base import InvalidRequest
from gateway.api.base import parse_json
from gateway.batch.objects import BATCH_ENDPOINTS, COMPLETION_WINDOW, Batch, NotFound, new_id
from gateway.batch.runner import BatchRunner

router = APIRouter()

_FORM_LIMITS = {"max_files": 1, "max_fields": 8}


class BatchCreateWire(BaseModel):
    """The body of ``POST /v1/batches``."""

    input_file_id: str = Field(min_length=1)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


_UPLOAD_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}
_CREATE_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": BatchCreateWire.model_json_schema()}},
    }
}


def _runner(request: Request) -> BatchRunner:
    runner: BatchRunner = request.app.state.batch_runner
    return runner


def _owner(request: Request) -> str:
    """The calling key's name (401 without a valid key where keys are required), as the
    front door (``gateway.edge.door``, reached through the app's state) identifies it."""
    return str(request.app.state.llmso.door.identify(request.scope).name)


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _page(data: list[dict[str, Any]], has_more: bool) -> Response:
    return _json(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


@router.post("/v1/files", openapi_extra=_UPLOAD_DOC, summary="Upload a batch input file")
async def create_file(request: Request) -> Response:
    owner = _owner(request)
    files = _runner(request).files
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > files.max_bytes + 64 * 1024:
        raise files.too_large()
    try:
        form = await request.form(**_FORM_LIMITS)
    except Exception as exc:  # Starlette's MultiPartException and parser errors
        raise InvalidRequest(f"body is not a valid multipart form: {exc}") from None
    try:
        purpose = form.get("purpose")
        upload = form.get("file")
        if purpose != "batch":
            raise InvalidRequest("purpose must be 'batch' (the only one served)", param="purpose")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("file is required (a JSONL file)", param="file")
        file = await files.upload(owner, "batch", upload.filename or "input.jsonl", upload.file)
    finally:
        await form.close()
    return _json(file.to_json())


@router.get("/v1/files", summary="List files")
async def list_files(
    request: Request,
    purpose: str | None = Query(None),
    limit: int = Query(10000),
    after: str | None = Query(None),
    order: str = Query("desc"),
) -> Response:
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'", param="order")
    if not 1 <= limit <= 10000:
        raise InvalidRequest("limit must be between 1 and 10000", param="limit")
    found = await _runner(request).state.files(_owner(request), purpose)
    if order == "asc":
        found.reverse()
    ids = [f.id for f in found]
    if after is not None:
        if after not in ids:
            raise InvalidRequest(f"no file {after!r}", param="after")
        found = found[ids.index(after) + 1 :]
    return _page([f.to_json() for f in found[:limit]], len(found) > limit)


@router.get("/v1/files/{file_id}", summary="Retrieve a file")
async def get_file(file_id: str, request: Request) -> Response:
    file = await _runner(request).files.get(_owner(request), file_id)
    return _json(file.to_json())


@router.get("/v1/files/{file_id}/content", summary="A file's content")
async def file_content(file_id: str, request: Request) -> Response:
    files = _runner(request).files
    data = await files.content(await files.get(_owner(request), file_id))
    return Response(data, media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", summary="Delete a file")
async def delete_file(file_id: str, request: Request) -> Response:
    files = _runner(request).files
    await files.delete(await files.get(_owner(request), file_id))
    return _json({"id": file_id, "object": "file", "deleted": True})


async def _render(runner: BatchRunner, batch: Batch) -> dict[str, Any]:
    completed, failed = await runner.state.counts(batch.id)
    return batch.to_json(completed, failed)


@router.post("/v1/batches", openapi_extra=_CREATE_DOC, summary="Create a batch")
async def create_batch(request: Request) -> Response:
    owner = _owner(request)
    wire = parse_json(BatchCreateWire, await request.body())
    if wire.endpoint not in BATCH_ENDPOINTS:
        served = ", ".join(BATCH_ENDPOINTS)
        raise InvalidRequest(f"endpoint must be one of {served}", param="endpoint")
    if wire.completion_window != COMPLETION_WINDOW:
        raise InvalidRequest("completion_window must be '24h'", param="completion_window")
    metadata = wire.metadata or {}
    if len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise InvalidRequest(
            "metadata: at most 16 pairs, keys up to 64 and values up to 512 characters",
            param="metadata",
        )
    runner = _runner(request)
    file = await runner.state.file(wire.input_file_id)
    if file is None or file.owner != owner or file.purpose != "batch":
        raise InvalidRequest(
            f"input_file_id {wire.input_file_id!r} is not a file uploaded with purpose 'batch'",
            param="input_file_id",
        )
    batch = Batch(
        id=new_id("batch"),
        owner=owner,
        endpoint=wire.endpoint,
        input_file_id=file.id,
        created_at=int(time.time()),
        metadata=metadata,
    )
    await runner.state.add_batch(batch)
    return _json(batch.to_json(0, 0))


@router.get("/v1/batches", summary="List batches")
async def list_batches(
    request: Request, after: str | None = Query(None), limit: int = Query(20)
) -> Response:
    if not 1 <= limit <= 100:
        raise InvalidRequest("limit must be between 1 and 100", param="limit")
    runner = _runner(request)
    found = await runner.state.batches(_owner(request), after, limit + 1)
    data = [await _render(runner, batch) for batch in found[:limit]]
    return _page(data, len(found) > limit)


async def _own_batch(request: Request, batch_id: str) -> Batch:
    batch = await _runner(request).state.batch(batch_id)
    if batch is None or batch.owner != _owner(request):
        raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
    return batch


@router.get("/v1/batches/{batch_id}", summary="Retrieve a batch")
async def get_batch(batch_id: str, request: Request) -> Response:
    return _json(await _render(_runner(request), await _own_batch(request, batch_id)))


@router.post("/v1/batches/{batch_id}/cancel", summary="Cancel a batch")
async def cancel_batch(batch_id: str, request: Request) -> Response:
    """Cancelling: the runner stops starting lines, lets those in flight finish, writes
    the output and error files of what finished, and ends it ``cancelled``."""
    await _own_batch(request, batch_id)
    runner = _runner(request)
    batch = await runner.state.request_cancel(batch_id, int(time.time()))
    if batch is None:
        raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
    return _json(await _render(runner, batch))
