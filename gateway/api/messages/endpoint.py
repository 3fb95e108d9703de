"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API
served by the same completion service as chat (``gateway.api.base``), so the front door,
limits, usage, metrics, traces and the request log are the chat route's own. Errors on
these paths render in Anthropic's envelope (``gateway.errors.error_body``).

``count_tokens`` runs the translated request for one token and answers the prompt's
token count from the backend's ``Usage``: the exact count of the prompt the model sees
(chat template and tools included) on every backend, at the price of one prefill.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any, TypeVar

import orjson

from backends.base import ApiError, SamplingParams
from gateway.api.base import Endpoint, GenerationPresenter, Prepared, parse_wire
from gateway.api.messages.render import (
    MessageAssembler,
    event,
    message_body,
    message_delta,
    message_start,
    new_id,
)
from gateway.api.messages.translate import messages_request, prompt_request, thought_shown
from gateway.api.messages.wire import CountTokensRequest, MessagesRequest
from gateway.api.thought_seal import ThoughtSeal
from gateway.errors import InternalError, anthropic_payload
from gateway.observe.record import RequestRecord
from gateway.service.chat_bodies import END_OF_FRAMES
from gateway.service.generation import CompletionService, Generation

log = logging.getLogger(__name__)


_WireT = TypeVar("_WireT", bound=CountTokensRequest)


class _MessagesApi(Endpoint):
    """Stateless per request; ``seal`` signs the thinking blocks it answers with and
    checks those sent back."""

    def __init__(self, service: CompletionService, seal: ThoughtSeal) -> None:
        self._service = service
        self._seal = seal

    @staticmethod
    def _parse(model: type[_WireT], body: Any, record: RequestRecord) -> _WireT:
        wire = parse_wire(model, body)
        unknown = wire.unknown_fields()
        if unknown and log.isEnabledFor(logging.DEBUG):
            log.debug("request %s: ignoring unknown fields %s", record.request_id, unknown)
        record.requested_model = wire.model  # known even when translate refuses
        return wire


class MessagesEndpoint(_MessagesApi):
    path = "/v1/messages"
    wire = MessagesRequest
    summary = "Create a message (Anthropic Messages API)"

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Generation]:
        wire = self._parse(MessagesRequest, body, record)
        request, params = messages_request(wire, record.request_id, record.arrival_time, self._seal)
        presenter = MessagesPresenter(
            self._service, new_id("msg"), self._seal, shown=thought_shown(wire.thinking)
        )
        return Prepared(request, wire.stream, presenter, params)


class MessagesPresenter(GenerationPresenter):
    """Renders one message; owned by the task serving its request."""

    __slots__ = ("_id", "_seal", "_shown")

    def __init__(
        self, service: CompletionService, message_id: str, seal: ThoughtSeal, *, shown: bool
    ) -> None:
        super().__init__(service)
        self._id = message_id
        self._seal = seal
        self._shown = shown

    def _assembler(self) -> MessageAssembler:
        return MessageAssembler(self._seal, shown=self._shown)

    async def body(self, generation: Generation) -> bytes:
        output = self._assembler()
        async with contextlib.aclosing(self.observed_events(generation)) as events:
            async for item in events:
                output.feed(item)
        return orjson.dumps(message_body(self._id, generation.shown_model, output))

    async def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        output = self._assembler()
        yield message_start(self._id, generation.shown_model)
        try:
            async with contextlib.aclosing(self.observed_events(generation)) as events:
                async for item in events:
                    for frame in output.feed(item):
                        yield frame
        except ApiError as exc:
            yield self._failed(generation, exc)
            return
        except Exception as exc:
            log.exception("message %s failed mid-stream", self._id)
            yield self._failed(generation, InternalError(f"internal error: {type(exc).__name__}"))
            return
        for frame in output.finish():
            yield frame
        yield message_delta(output)
        yield event("message_stop")
        yield END_OF_FRAMES

    def _failed(self, generation: Generation, exc: ApiError) -> bytes:
        generation.record.fail("error", exc.error_type)
        log.warning("message %s failed mid-stream: %s", self._id, exc.message)
        return event("error", error=anthropic_payload(exc)["error"])


class CountTokensEndpoint(_MessagesApi):
    path = "/v1/messages/count_tokens"
    wire = CountTokensRequest
    summary = "Count the tokens of a message request (Anthropic Messages API)"

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Generation]:
        wire = self._parse(CountTokensRequest, body, record)
        sampling = SamplingParams(max_tokens=1, temperature=0.0)
        request, params = prompt_request(
            wire, sampling, record.request_id, record.arrival_time, self._seal
        )
        # A forced tool call would hold the one token to a grammar: counting needs none.
        request = replace(request, tool_choice=None)
        return Prepared(request, False, CountTokensPresenter(self._service), params)


class CountTokensPresenter(GenerationPresenter):
    async def body(self, generation: Generation) -> bytes:
        output = MessageAssembler()
        async with contextlib.aclosing(self.observed_events(generation)) as events:
            async for item in events:
                output.feed(item)
        tokens = output.usage.prompt_tokens if output.usage is not None else 0
        return orjson.dumps({"input_tokens": tokens})

    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        raise AssertionError("count_tokens never streams")
