"""One attempt at one upstream request: send, check the answer, relay the stream.

``UpstreamStream`` wraps a single response of the lean client (``backends.openai_proxy.http1``). It
is owned by the coroutine that runs the request (the backend's ``generate``) and must be
closed by it: ``close()`` on a stream that has not ended drops the connection, which is
how an engine learns that the client left and aborts the generation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from backends.base import (
    BackendError,
    BackendEvent,
    Overloaded,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from backends.openai_proxy.errors import from_exception, from_status
from backends.openai_proxy.http1 import Pool, Response
from backends.openai_proxy.stream import ChunkTranslator, SSEDecoder

_MAX_ERROR_BODY = 64 * 1024


class EmptyStream(UpstreamBadResponse):
    """A 200 answer that ended, or dropped the connection, before a single byte of
    stream: how llama.cpp reports a request it rejects once streaming has begun (e.g. a
    prompt longer than its context). ``cause`` is the transport error, if any."""

    def __init__(self, message: str, *, cause: BackendError | None = None) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class HopMetrics:
    """The metric children of one model's upstream hop, resolved once at construction."""

    latency: Any
    ttft: Any
    requests: Any
    """``upstream_requests`` family; labelled per outcome with ``labels``."""
    labels: tuple[str, str]
    children: dict[str, Any] = field(default_factory=dict)
    """``requests`` children by outcome, looked up once each (outcomes are a fixed set)."""

    def count(self, status: str) -> None:
        child = self.children.get(status)
        if child is None:
            child = self.children[status] = self.requests.labels(*self.labels, status)
        child.inc()


class UpstreamStream:
    """Send one request and read its SSE answer in batches of events.

    ``waited`` accumulates the seconds spent blocked on the upstream (connecting, waiting
    for headers, waiting for bytes); time spent handing events to the consumer is not
    included. Exactly one ``upstream_requests`` sample is counted per attempt, labelled
    with the HTTP status, or ``unavailable``/``timeout``/``bad_response``/``aborted``.
    """

    __slots__ = (
        "_decoder",
        "_first_seen",
        "_got_bytes",
        "_metrics",
        "_outcome",
        "_response",
        "_sent",
        "_url",
        "ended",
        "translator",
        "waited",
    )

    def __init__(self, url: str, translator: ChunkTranslator, metrics: HopMetrics) -> None:
        self._url = url
        self._metrics = metrics
        self._decoder = SSEDecoder()
        self.translator = translator
        self._response: Response | None = None
        self._sent = 0.0
        self._first_seen = False
        self._got_bytes = False
        self._outcome: str | None = None
        self.ended = False
        self.waited = 0.0

    async def open(self, pool: Pool, body: bytes, headers: dict[str, str] | None = None) -> None:
        """POST ``body`` (with extra ``headers``, e.g. W3C trace context); raises the mapped
        ``BackendError`` unless the answer is 200."""
        self._sent = time.perf_counter()
        try:
            response = await pool.post(self._url, body, headers)
        except OSError as exc:
            self.waited += time.perf_counter() - self._sent
            raise self._fail(from_exception(exc, url=self._url)) from exc
        self._response = response
        if response.status != 200:
            try:
                raw = await response.read(_MAX_ERROR_BODY)
            except OSError:
                raw = b""
            self.waited += time.perf_counter() - self._sent
            self._outcome = str(response.status)
            self._metrics.count(self._outcome)
            raise from_status(response.status, raw, response.header("Retry-After"))
        self.waited += time.perf_counter() - self._sent

    async def first_events(self) -> list[BackendEvent]:
        """Read until the stream yields events or ends (role-only chunks carry none)."""
        while not self.ended:
            events = await self.next_events()
            if events:
                return events
        return []

    async def next_events(self) -> list[BackendEvent]:
        """The events of the next bytes to arrive; at end of stream, sets ``ended``."""
        response = self._response
        if response is None:  # closed under us: stop() or a prior failure
            raise UpstreamUnavailable(f"stream from {self._url} was closed")
        began = time.perf_counter()
        try:
            data = await response.read_some()
        except OSError as exc:
            self.waited += time.perf_counter() - began
            error = from_exception(exc, url=self._url)
            if not self._got_bytes and not isinstance(error, UpstreamTimeout):
                error = EmptyStream(f"upstream {self._url} sent nothing: {error}", cause=error)
            raise self._fail(error) from exc
        now = time.perf_counter()
        self.waited += now - began
        out: list[BackendEvent] = []
        try:
            if data:
                self._got_bytes = True
                self.translator.translate_all(self._decoder.feed(data), out)
            else:
                self.translator.translate_all(self._decoder.flush(), out)
                self._end(out, now)
        except BackendError as exc:
            raise self._fail(exc) from exc
        if out and not self._first_seen:
            self._first_seen = True
            self._metrics.ttft.observe(now - self._sent)
        return out

    def close(self) -> None:
        """Release the connection; drops it when the stream has not ended (abort)."""
        if self._outcome is None:
            self._outcome = "aborted"
            self._metrics.count(self._outcome)
        response, self._response = self._response, None
        if response is not None:
            if self.ended:
                response.release()
            else:
                response.close()

    def _end(self, out: list[BackendEvent], now: float) -> None:
        translator = self.translator
        if not self._got_bytes:
            raise EmptyStream(f"upstream {self._url} answered 200 with an empty stream")
        if not translator.done and not translator.all_finished:
            raise UpstreamBadResponse(f"upstream {self._url} ended its stream early")
        translator.finish(out)
        self.ended = True
        self._outcome = "200"
        self._metrics.count(self._outcome)
        self._metrics.latency.observe(now - self._sent)

    def _fail(self, error: BackendError) -> BackendError:
        if self._outcome is None:
            cause = error.cause if isinstance(error, EmptyStream) else None
            self._outcome = _label(cause or error)
            self._metrics.count(self._outcome)
        return error


def _label(error: BackendError) -> str:
    if isinstance(error, Overloaded):
        return "429"
    if error.status == 504:
        return "timeout"
    if error.status == 503:
        return "unavailable"
    return "bad_response"


async def unhidden_error(
    session: aiohttp.ClientSession, url: str, body: bytes, empty: EmptyStream
) -> BackendError:
    """Ask again without streaming to learn why the stream came back empty (only for
    engines that hide errors that way). The body is unchanged, so the engine rejects
    it the same way; should it answer 200 instead, the empty stream stays a 502."""
    plain = orjson.loads(body)
    plain["stream"] = False
    plain.pop("stream_options", None)
    data = orjson.dumps(plain)
    error: BackendError = empty
    for _ in range(2):  # once more if a pooled connection was stale
        try:
            async with session.post(url, data=data) as response:
                raw = await response.content.read(64 * 1024)
                if response.status == 200:
                    return empty
                return from_status(response.status, raw, response.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = from_exception(exc, url=url)
    return error


_JSON_HEADERS = {"Accept": "application/json"}


async def post_json(session: aiohttp.ClientSession, url: str, body: bytes) -> Any:
    """POST ``body`` for a whole (not streamed) JSON answer; raises the contract's errors
    for a failed, refused or malformed answer (embeddings, scored prompts)."""
    try:
        async with session.post(url, data=body, headers=_JSON_HEADERS) as response:
            if response.status != 200:
                raw = await response.content.read(_MAX_ERROR_BODY)
                raise from_status(response.status, raw, response.headers.get("Retry-After"))
            return orjson.loads(await response.read())
    except BackendError:
        raise
    except orjson.JSONDecodeError:
        raise UpstreamBadResponse(f"upstream {url} answered with invalid JSON") from None
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise from_exception(exc, url=url) from None
