"""The completion service: routes a ``GenerationRequest`` and shapes what comes back.

``open()`` picks a model through the registry (a split route's target by the request's
session or id), walking the fallback chain while nothing has been sent to the client yet,
and returns a ``Generation`` whose first event is already in hand: errors that a backend
raises before its first event (bad input, context too long, overloaded, upstream down)
therefore become ordinary HTTP errors, never a broken stream. Once a model has taken the
request, a copy may go to the model's shadow (``gateway.service.mirror``). ``complete()``
collects a whole response; ``stream()`` yields SSE frames and, if the backend fails
mid-way, one error event and ``[DONE]``.

Between requests the service holds only its ``Mirrors`` (the copies in flight, cancelled
by ``stop()``); each ``Generation`` is owned by the task serving its request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from backends.base import (
    BackendError,
    BackendEvent,
    Finished,
    GenerationRequest,
    NotReady,
    Overloaded,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UpstreamBadResponse,
    Usage,
)
from backends.hop_metrics import BackendMetrics
from config.frontdoor import PRIORITY_RANK
from gateway.access.keys import allowed_candidates
from gateway.errors import error_payload
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import RequestRecord
from gateway.observe.timing import timing_header
from gateway.registry import ModelRegistry
from gateway.registry.split import SplitKey, mirrored
from gateway.service.capabilities import reasoning_controls, require_features
from gateway.service.chat_bodies import (
    END_OF_FRAMES,
    SSE_DONE,
    ChoiceAccumulator,
    ChunkWriter,
    full_response,
    new_id,
    sse,
)
from gateway.service.mirror import Copy, MirrorMetrics, Mirrors

log = logging.getLogger(__name__)

# Errors after which the next model of a fallback chain may answer instead: the request
# itself was fine, this model could not take it.
FALLBACK_ERRORS: tuple[type[BackendError], ...] = (NotReady, Overloaded)

# A mirror's copy queues behind the shadow's own traffic and is shed first.
_MIRROR_PRIORITY = PRIORITY_RANK["low"]


@dataclass(slots=True)
class Generation:
    """One routed request with its first backend event already received."""

    request: GenerationRequest
    record: RequestRecord
    model: str
    backend: str
    first: BackendEvent
    events: AsyncIterator[BackendEvent]
    closer: Callable[[], Awaitable[None]]  # ends the backend stream, then frees the model
    response_id: str
    created: int

    @property
    def shown_model(self) -> str:
        """The model name responses show: the adapter's when one answered (as vLLM
        does), else the serving model's."""
        return self.request.adapter or self.model

    async def all_events(self) -> AsyncIterator[BackendEvent]:
        yield self.first
        async for event in self.events:
            yield event

    async def close(self) -> None:
        await self.closer()


class _Release:
    """Closes one routed generation: the backend's stream first, then the model lease.
    Idempotent. A class with two fields, not an ``AsyncExitStack``: one is built per
    request, and the stack's callback wrappers cost several times more."""

    __slots__ = ("events", "leasing")

    def __init__(self, leasing: AbstractAsyncContextManager[Any]) -> None:
        self.leasing = leasing
        self.events: AsyncIterator[BackendEvent] | None = None

    async def __call__(self) -> None:
        events, self.events = self.events, None
        try:
            if events is not None:
                await _aclose(events)
        finally:
            await self.leasing.__aexit__(None, None, None)


class CompletionService:
    def __init__(
        self,
        registry: ModelRegistry,
        metrics: GatewayMetrics,
        backend_metrics: BackendMetrics,
        mirror_metrics: MirrorMetrics,
    ) -> None:
        self._registry = registry
        self._metrics = metrics
        self._backend_metrics = backend_metrics
        self._overhead: dict[tuple[str, str], Any] = {}  # children, one per model
        self.mirrors = Mirrors(self._send_shadow, mirror_metrics)

    async def stop(self) -> None:
        """Cancel the mirror copies still in flight (the gateway is stopping)."""
        await self.mirrors.stop()

    async def open(self, request: GenerationRequest, record: RequestRecord) -> Generation:
        key = SplitKey(request.request_id, request.session_id or request.user)
        decision = self._registry.route(request.model, key, record.may_use)
        allowed = allowed_candidates(request.model, decision.key_checks, record.may_use)
        candidates = allowed if decision.adapter is None else decision.candidates
        if decision.adapter is not None:
            request = replace(request, adapter=decision.adapter)
            record.adapter = decision.adapter
        if decision.route is not None and record.route is None:  # once per request, not
            self._registry.record_split(decision)  # per prompt of a multi-prompt completion
            record.route = decision.route
        for position, name in enumerate(candidates):
            try:
                generation = await self._open_on(name, request, record)
            except FALLBACK_ERRORS as exc:
                if position + 1 >= len(candidates):
                    raise
                following = candidates[position + 1]
                self._registry.record_fallback(name, following, type(exc).__name__)
                record.fallback_from.append(name)
                continue
            self._mirror(generation, request)
            return generation
        raise AssertionError("route() returned no candidates")

    async def _open_on(
        self, name: str, request: GenerationRequest, record: RequestRecord
    ) -> Generation:
        leasing = self._registry.lease(name)
        lease = await leasing.__aenter__()
        release = _Release(leasing)
        try:
            routed = request if request.model == name else replace(request, model=name)
            if record.trace is not None:
                routed = record.trace.enter_backend(routed, lease.config.backend)
            info = lease.backend.info()
            require_features(routed, name, info)
            routed, ignored = reasoning_controls(routed, info)
            if ignored:
                record.reasoning_ignored = ignored
            events = release.events = lease.backend.generate(routed)
            record.bind(name, lease.config.backend, self._metrics, lease.config.pricing)
            try:
                first = await anext(events)
            except StopAsyncIteration:
                raise UpstreamBadResponse(f"model {name!r} returned no output") from None
            record.observe(first)
        except BaseException:
            await release()
            raise
        return Generation(
            request=routed,
            record=record,
            model=name,
            backend=lease.config.backend,
            first=first,
            events=events,
            closer=release,
            response_id=new_id(request.kind),
            created=int(record.arrival_time),
        )

    def _mirror(self, generation: Generation, request: GenerationRequest) -> None:
        """Offer a copy of ``request`` to the shadow of the model that took it, when the
        model has one and the request id falls in its share. A request naming a LoRA
        adapter is not copied: the shadow has no such adapter."""
        found = self._registry.mirror_of(generation.model)
        if found is None or request.adapter is not None:
            return
        shadow, mirror = found
        if not mirrored(request.request_id, mirror.share):
            return
        copy = replace(
            request,
            request_id=f"{request.request_id}-mirror",
            model=shadow,
            trace_headers=(),
            priority=max(request.priority, _MIRROR_PRIORITY),
        )
        primary = generation.record
        self.mirrors.offer(
            Copy(
                generation.model,
                shadow,
                copy,
                primary.request_id,
                mirror.max_inflight,
                primary.endpoint,
                primary.batch_id,
            )
        )

    async def _send_shadow(
        self, shadow: str, request: GenerationRequest, record: RequestRecord
    ) -> None:
        """A mirror's copy, on the shadow alone (no fallback), read whole and dropped."""
        await self.complete(await self._open_on(shadow, request, record))

    async def complete(
        self, generation: Generation, legacy_functions: bool = False
    ) -> dict[str, Any]:
        """Collect every event into one response body. Closes the generation.
        ``legacy_functions``: a call is rendered as the old ``function_call``."""
        choices = [ChoiceAccumulator() for _ in range(generation.request.sampling.n)]
        usage = Usage(0, 0)
        try:
            async for event in generation.all_events():
                if event is not generation.first:
                    generation.record.observe(event)
                if isinstance(event, TextDelta):
                    choice = choices[event.index]
                    choice.parts.append(event.text)
                    choice.logprobs.extend(event.logprobs)
                elif isinstance(event, ReasoningDelta):
                    choices[event.index].reasoning.append(event.text)
                elif isinstance(event, ToolCallDelta):
                    choices[event.index].add_tool_delta(event)
                elif isinstance(event, Finished):
                    choices[event.index].finish_reason = event.reason
                elif isinstance(event, Usage):
                    usage = event
        finally:
            await generation.close()
        self.observe_overhead(generation)
        return full_response(
            generation.request.kind,
            response_id=generation.response_id,
            created=generation.created,
            model=generation.shown_model,
            choices=choices,
            usage=usage,
            want_logprobs=generation.request.sampling.logprobs is not None,
            legacy_functions=legacy_functions,
        )

    async def stream(
        self, generation: Generation, include_usage: bool, legacy_functions: bool = False
    ) -> AsyncGenerator[bytes, None]:
        """SSE frames: role, deltas, finish per choice, usage if asked, ``[DONE]``.

        The caller must consume or close this iterator; closing it (client gone) closes
        the backend stream, which aborts the work behind it.
        """
        record = generation.record
        writer = ChunkWriter(
            generation.request.kind,
            generation.response_id,
            generation.created,
            generation.shown_model,
            generation.request.sampling.logprobs is not None,
            legacy_functions=legacy_functions,
        )
        chat = generation.request.kind.value == "chat"
        ended = False
        try:
            try:
                if chat:
                    for index in range(generation.request.sampling.n):
                        yield writer.role(index)
                # The first event, then the backend's own iterator: not through
                # `all_events`, one async-generator hop less for every event (and its
                # `__anext__` itself: `anext(events, None)` wraps each step once more).
                following = generation.events.__anext__
                event: BackendEvent | None = generation.first
                while event is not None:
                    if event is not generation.first:
                        record.observe(event)
                    if isinstance(event, TextDelta):
                        if event.text or event.logprobs:
                            yield writer.text(event.index, event.text, event.logprobs)
                    elif isinstance(event, ReasoningDelta):
                        if (frame := writer.reasoning(event.index, event.text)) is not None:
                            yield frame
                    elif isinstance(event, ToolCallDelta):
                        if (frame := writer.tool_call(event)) is not None:
                            yield frame
                    elif isinstance(event, Finished):
                        yield writer.finish(event.index, event.reason)
                    elif isinstance(event, Usage) and include_usage:
                        yield writer.usage(event)
                    try:
                        event = await following()
                    except StopAsyncIteration:
                        event = None
            except Exception as exc:
                yield _failure_frame(record, exc)
            yield SSE_DONE
            ended = True
            # The client has all it gets: the edge ends the response now, and the
            # bookkeeping below (backend close, metrics, log line) runs after that.
            yield END_OF_FRAMES
        except (asyncio.CancelledError, GeneratorExit):
            if not ended:
                record.fail("disconnected", None)
            raise
        finally:
            await generation.close()
            if record.status == "ok":
                self.observe_overhead(generation)
            record.finish()

    def observe_overhead(self, generation: Generation) -> None:
        upstream = generation.record.upstream_seconds
        if upstream is None:
            return
        overhead = max(0.0, generation.record.elapsed - upstream)
        key = (generation.model, generation.backend)
        child = self._overhead.get(key)
        if child is None:
            child = self._overhead[key] = self._backend_metrics.overhead.labels(*key)
        child.observe(overhead)


def _failure_frame(record: RequestRecord, exc: Exception) -> bytes:
    """The error event of a stream that failed mid-way with ``exc`` (counted, logged)."""
    if isinstance(exc, BackendError):
        record.fail("error", exc.error_type)
        log.warning("request %s failed mid-stream: %s", record.request_id, exc.message)
        return sse(error_payload(exc))
    record.fail("error", "server_error")
    log.error("request %s failed mid-stream", record.request_id, exc_info=exc)
    return sse(error_payload(BackendError(f"internal error: {type(exc).__name__}")))


async def _aclose(events: AsyncIterator[BackendEvent]) -> None:
    closer = getattr(events, "aclose", None)
    if closer is not None:
        await closer()


def server_timing(generation: Generation) -> str:
    """``Server-Timing`` value for a response (see ``gateway.observe.timing``)."""
    return timing_header(generation.record)
