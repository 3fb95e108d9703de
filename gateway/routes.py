"""Thin HTTP handlers: parse the wire body, call the service, render.

Bodies are read with a size limit and parsed once with orjson + pydantic; every failure
is raised as a typed error for the one handler in ``gateway.errors``. While a request
waits for its first token (and for the whole of a non-streamed response) a watcher
listens for the client leaving, and cancels the work so no compute is spent on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response, StreamingResponse

from backends.base import BackendError, GenerationRequest, InvalidRequest
from gateway.errors import RequestTooLarge, from_validation_error
from gateway.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from gateway.service import CompletionService, server_timing
from gateway.state import AppState
from gateway.tracking import RequestRecord
from gateway.translate import chat_request, completion_request, report_unknown_fields

log = logging.getLogger(__name__)

router = APIRouter()
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
_WireT = TypeVar("_WireT", bound=BaseModel)
_T = TypeVar("_T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was ready."""


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _handle(request, ChatCompletionRequest, chat_request)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _handle(request, CompletionRequest, completion_request)


async def _handle(
    request: Request,
    wire_type: type[_WireT],
    translate: Callable[[_WireT, str, float], GenerationRequest],
) -> Response:
    state = _state(request)
    request_id = request_id_for(request)
    record = RequestRecord(request_id=request_id, requested_model="")
    wire = _parse(wire_type, await read_json(request, state.max_body_bytes))
    assert isinstance(wire, SamplingFields)
    report_unknown_fields(wire, request_id)
    include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
    generation_request = translate(wire, request_id, record.arrival_time)
    return await _serve(
        request,
        state.service,
        generation_request,
        record,
        stream=wire.stream,
        include_usage=include_usage,
    )


async def _serve(
    request: Request,
    service: CompletionService,
    generation_request: GenerationRequest,
    record: RequestRecord,
    *,
    stream: bool,
    include_usage: bool,
) -> Response:
    record.requested_model = generation_request.model
    headers = {"X-Request-ID": record.request_id}
    try:
        generation = await until_disconnect(request, service.open(generation_request, record))
        if stream:
            headers["Server-Timing"] = server_timing(generation)
            return StreamingResponse(
                service.stream(generation, include_usage),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        body = await until_disconnect(request, service.complete(generation))
        headers["Server-Timing"] = server_timing(generation)
    except BackendError as exc:
        record.fail("client_error" if exc.status < 500 else "server_error", exc.error_type)
        record.finish()
        raise
    except ClientDisconnected:
        record.fail("disconnected", None)
        record.finish()
        return Response(status_code=499)
    except BaseException:
        record.fail("server_error", "server_error")
        record.finish()
        raise
    record.finish()
    return Response(orjson.dumps(body), media_type="application/json", headers=headers)


async def until_disconnect(request: Request, work: Awaitable[_T]) -> _T:
    """Await ``work`` unless the client disconnects first; then cancel it.

    Only valid after the body has been read: the next ASGI message is then the
    disconnect. Cancelling ``work`` closes the backend stream, which aborts generation.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, BackendError):
        await task
    raise ClientDisconnected()


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def request_id_for(request: Request) -> str:
    supplied = request.headers.get("x-request-id")
    request_id = supplied if supplied and _REQUEST_ID.match(supplied) else secrets.token_hex(16)
    request.state.request_id = request_id
    return request_id


async def read_json(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLarge(f"request body is larger than {limit} bytes")
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


def _parse(model: type[_WireT], body: Any) -> _WireT:
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.llmso
    return state
