"""One request to a public endpoint on one connection, served as plain ASGI: read the
body with a size limit and decode it once with orjson, then the endpoint's steps
(``gateway.api.base``): parse, admit at the front door, one service call, present.
Every failure is a typed ``ApiError`` rendered by ``gateway.errors.error_body``. A
watcher listens for the client leaving for the whole life of a request, and cancels the
work so no compute is spent on a client that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, Awaitable
from typing import Any

import orjson

from backends.base import ApiError, GenerationRequest, InvalidRequest
from gateway.api.base import Endpoint, Prepared
from gateway.edge.asgi_types import Message, Receive, Scope, Send
from gateway.edge.door import admit, body_send, door_record
from gateway.edge.sse_batch import send_frames
from gateway.edge.state import AppState
from gateway.edge.transport import DISCONNECT_HOOK, DisconnectHook
from gateway.edge.web import request_id as _request_id
from gateway.errors import (
    InternalError,
    RequestTooLarge,
    error_body,
)
from gateway.observe.record import RequestRecord
from gateway.observe.timing import timing_header
from gateway.observe.trace_context import client_trace_headers

log = logging.getLogger(__name__)

JSON_HEADER = (b"content-type", b"application/json")
# On a whole (non-streamed) response whose JSON value or tool call the engine closed
# because max_tokens was near; a stream's headers go out first, so there only the
# request log's ``closed_by_budget`` and ``llmso_closed_by_budget_total`` tell.
CLOSED_BY_BUDGET_HEADER = b"x-llmso-closed-by-budget"
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


class EndpointCall:
    """One endpoint request on one connection; owned by the task that runs it."""

    __slots__ = (
        "_complete",
        "_disconnected",
        "_receive",
        "_scope",
        "_send",
        "_started",
        "_state",
        "record",
    )

    def __init__(self, state: AppState, scope: Scope, receive: Receive, send: Send) -> None:
        self._state = state
        self._scope = scope
        self._receive = receive
        self._send = send
        self._started = False
        self._complete = False
        self._disconnected = False
        self.record = door_record(scope) or RequestRecord(
            request_id=_request_id(scope), requested_model="", endpoint=scope["path"]
        )

    async def _guarded(self, work: Awaitable[None]) -> None:
        """Await ``work`` (one request's serving), render what it raises as an error
        response, and finish the record once."""
        record = self.record
        if self._state.tracing is not None:
            record.trace = self._state.tracing.start_request(self._scope, record.request_id)
        try:
            await work
        except ClientDisconnected:
            record.fail("disconnected", None)
        except ApiError as exc:
            record.fail("client_error" if exc.status < 500 else "server_error", exc.error_type)
            await self._send_error(exc)
        except Exception:
            log.exception("request %s failed", record.request_id)
            record.fail("server_error", "server_error")
            await self._send_error(InternalError("internal server error"))
        finally:
            if record.model or door_record(self._scope) is None:
                record.finish()  # else the front door finishes it, after its settlement
            if record.trace is not None:
                record.trace.end(record, record.finish_time or time.time())

    async def serve(self, endpoint: Endpoint) -> None:
        """Serve ``endpoint``: parse, admit once, one service call, present
        (``gateway.api.base``)."""
        await self._guarded(self._serve(endpoint))

    async def _serve(self, endpoint: Endpoint) -> None:
        prepared = await endpoint.prepare(
            await self._read_body(self._state.max_body_bytes), self.record
        )
        self.record.requested_model = prepared.request.model
        try:
            await self._answer(prepared)
        except ApiError as exc:
            if exc.param and prepared.wire_param is not None and not self._started:
                exc.param = prepared.wire_param(exc.param)
            raise

    def _traced(self, request: GenerationRequest) -> GenerationRequest:
        """Name the request on its trace, or (tracing off) relay the client's trace
        context to upstreams as it came."""
        if self.record.trace is not None:
            self.record.trace.requested(request)
            return request
        return client_trace_headers(self._scope, request)

    async def _answer(self, prepared: Prepared[Any]) -> None:
        request = await admit(self._scope, prepared.request)  # key's models and limits
        if prepared.generates:
            request = _with_session(self._traced(request), _header(self._scope, b"x-session-id"))
        presenter = prepared.presenter
        async with self._watch_disconnect():
            answer = await presenter.open(request, self.record)
            if prepared.stream:
                await self._stream(presenter.timing(answer), presenter.frames(answer))
                return
            body = await presenter.body(answer)
            await self._respond(200, body, self._headers(presenter.timing(answer), JSON_HEADER))

    async def _stream(self, timing: str, frames: AsyncGenerator[bytes, None]) -> None:
        # Every frame that is ready goes out in one send; the last one ends the body.
        try:
            await self._start(200, self._headers(timing, *_SSE_HEADERS))
        except BaseException:
            await frames.aclose()
            raise
        await send_frames(frames, body_send(self._scope, self._send), self._ending)

    def _ending(self) -> None:
        """The last body message is being sent: a disconnect from now on is expected."""
        self._complete = True

    def _watch_disconnect(self) -> _DisconnectWatch:
        """Cancel the serving task if the client leaves (``async with``)."""
        return _DisconnectWatch(self)

    async def _read_body(self, limit: int) -> Any:
        declared = _header(self._scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestTooLarge(f"request body is larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RequestTooLarge(f"request body is larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            return orjson.loads(b"".join(chunks))
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"request body is not valid JSON: {exc}") from None

    def _headers(self, timing: str, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        headers = [
            *extra,
            (b"x-request-id", self.record.request_id.encode()),
            (b"server-timing", timing.encode()),
        ]
        if self.record.closed_by_budget:  # known only once the body is whole (not streams)
            headers.append((CLOSED_BY_BUDGET_HEADER, b"true"))
        return headers

    async def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._started = True
        if self.record.trace is not None:
            self.record.trace.status_code = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def _respond(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        await self._start(status, headers)
        self._complete = True
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _send_error(self, exc: ApiError) -> None:
        if self._started:
            return  # a stream already reported its own failure in-band
        body, extra = error_body(exc, self._scope["path"])
        headers = [
            JSON_HEADER,
            (b"x-request-id", self.record.request_id.encode()),
            (b"server-timing", timing_header(self.record).encode()),
        ]
        headers.extend((name.lower().encode(), value.encode()) for name, value in extra.items())
        with contextlib.suppress(OSError, RuntimeError):
            await self._respond(exc.status, body, headers)


class _DisconnectWatch:
    """Cancels the serving task if the client leaves. Under ``llmso serve`` the protocol
    calls back on connection loss (``transport.DisconnectHook``); elsewhere (an ASGI
    test client, another server) a watcher task waits on ``receive``: the body is already
    read, so the next ASGI message can only be the disconnect. A class, not
    ``@asynccontextmanager``: one is entered per request."""

    __slots__ = ("_call", "_hook", "_task", "_watcher")

    def __init__(self, call: EndpointCall) -> None:
        self._call = call
        self._watcher: asyncio.Future[Message] | None = None

    async def __aenter__(self) -> None:
        hook: DisconnectHook | None = self._call._scope.get(DISCONNECT_HOOK)
        task = asyncio.current_task(None if hook is None else hook.loop)
        assert task is not None
        self._task = task
        self._hook = hook
        if hook is None:
            self._watcher = asyncio.ensure_future(self._call._receive())
            self._watcher.add_done_callback(self._on_message)
        elif hook.lost:
            raise ClientDisconnected()
        else:
            hook.callback = self._on_lost

    def _on_message(self, watcher: asyncio.Future[Message]) -> None:
        if watcher.cancelled() or watcher.exception() is not None:
            return
        if watcher.result().get("type") == "http.disconnect":
            self._on_lost()

    def _on_lost(self) -> None:
        call = self._call
        # After the last body message the server reports a disconnect by design.
        if not call._complete:
            call._disconnected = True
            self._task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if self._hook is not None:
            self._hook.callback = None
        elif self._watcher is not None:
            self._watcher.remove_done_callback(self._on_message)
            self._watcher.cancel()
        if (
            kind is not None
            and issubclass(kind, asyncio.CancelledError)
            and self._call._disconnected
        ):
            # Our own cancellation: the client left. Un-cancel so cleanup can await.
            self._task.uncancel()
            raise ClientDisconnected() from None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _with_session(request: GenerationRequest, session: str | None) -> GenerationRequest:
    """Carry the client's ``x-session-id`` (a replica-affinity key) to the backend."""
    if not session:
        return request
    if len(session) > 256:
        raise InvalidRequest("x-session-id is longer than 256 characters", param="x-session-id")
    return dataclasses.replace(request, session_id=session)
