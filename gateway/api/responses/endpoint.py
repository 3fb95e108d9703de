"""``POST /v1/responses``: prepare the request, render the response, keep it.

``ResponsesEndpoint`` is an ``Endpoint`` (``gateway.api.base``) like chat, so the body
limit, disconnect watcher, request record and metrics are the chat route's own.
The history behind ``previous_response_id`` comes from the store before routing; a
finished response is stored (unless ``store: false``) before its last byte is sent, so a
client that got the response can always continue it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from backends.base import ApiError
from gateway.api.base import Endpoint, GenerationPresenter, Prepared, parse_wire
from gateway.api.responses.output import OutputAssembler
from gateway.api.responses.render import EventWriter, ResponseShape, new_id, with_id
from gateway.api.responses.store import ResponseNotFound, ResponseStore, StoredResponse
from gateway.api.responses.translate import (
    ENCRYPTED_INCLUDE,
    generation_request,
    input_items,
    wire_param,
)
from gateway.api.responses.wire import ResponsesRequest
from gateway.api.thought_seal import ThoughtSeal
from gateway.errors import InternalError
from gateway.observe.record import RequestRecord
from gateway.service.generation import CompletionService, Generation

log = logging.getLogger(__name__)


class ResponsesEndpoint(Endpoint):
    """Stateless per request; ``store`` is owned by the app (closed by its lifespan);
    ``seal`` signs thoughts handed out as ``encrypted_content`` and checks those sent."""

    path = "/v1/responses"
    wire = ResponsesRequest
    summary = "Create a model response"

    def __init__(self, service: CompletionService, store: ResponseStore, seal: ThoughtSeal) -> None:
        self.service = service
        self.store = store
        self.seal = seal

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Generation]:
        wire = parse_wire(ResponsesRequest, body)
        unknown = wire.unknown_fields()
        if unknown and log.isEnabledFor(logging.DEBUG):
            log.debug("request %s: ignoring unknown fields %s", record.request_id, unknown)
        history: list[dict[str, Any]] = []
        if wire.previous_response_id is not None:
            previous = await self.store.get(wire.previous_response_id)
            if previous is None:
                raise ResponseNotFound(
                    f"Previous response with id '{wire.previous_response_id}' not found.",
                    param="previous_response_id",
                )
            history = previous.items
        conversation = [*history, *input_items(wire)]
        request = generation_request(
            wire, conversation, len(history), record.request_id, record.arrival_time,
            seal=self.seal,
        )  # fmt: skip
        shape = ResponseShape(new_id("resp"), int(record.arrival_time), wire.model, wire)
        sealed = ENCRYPTED_INCLUDE in (wire.include or ())
        presenter = ResponsesPresenter(
            self, shape, conversation, keep=wire.stores, seal=self.seal if sealed else None
        )
        return Prepared(request, wire.stream, presenter, wire_param)


class ResponsesPresenter(GenerationPresenter):
    """Renders one response; owned by the task serving its request."""

    __slots__ = ("_conversation", "_endpoint", "_keep", "_seal", "_shape")

    def __init__(
        self,
        endpoint: ResponsesEndpoint,
        shape: ResponseShape,
        conversation: list[dict[str, Any]],
        *,
        keep: bool,
        seal: ThoughtSeal | None,
    ) -> None:
        super().__init__(endpoint.service)
        self._endpoint = endpoint
        self._shape = shape
        self._conversation = conversation
        self._keep = keep
        self._seal = seal

    async def body(self, generation: Generation) -> bytes:
        self._shape.model = generation.shown_model
        output = OutputAssembler(lambda *_, **__: b"", self._seal)
        async with contextlib.aclosing(self.observed_events(generation)) as events:
            async for event in events:
                output.feed(event)
        output.finish()
        response = self._shape.render(output.status, output.output, output.usage)
        await self._keep_response(response)
        return orjson.dumps(response)

    async def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        shape = self._shape
        shape.model = generation.shown_model
        emit = EventWriter()
        output = OutputAssembler(emit, self._seal)
        yield emit("response.created", response=shape.render("in_progress", []))
        yield emit("response.in_progress", response=shape.render("in_progress", []))
        try:
            async with contextlib.aclosing(self.observed_events(generation)) as events:
                async for event in events:
                    for frame in output.feed(event):
                        yield frame
            for frame in output.finish():
                yield frame
            response = shape.render(output.status, output.output, output.usage)
            await self._keep_response(response)
        except ApiError as exc:
            yield self._failed(emit, generation, output, exc)
            return
        except Exception as exc:
            log.exception("response %s failed mid-stream", shape.id)
            error = InternalError(f"internal error: {type(exc).__name__}")
            yield self._failed(emit, generation, output, error)
            return
        final = (
            "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        )
        yield emit(final, response=response)

    def _failed(
        self, emit: EventWriter, generation: Generation, output: OutputAssembler, exc: ApiError
    ) -> bytes:
        generation.record.fail("error", exc.error_type)
        log.warning("response %s failed mid-stream: %s", self._shape.id, exc.message)
        response = self._shape.render("failed", output.snapshot(), output.usage, exc)
        return emit("response.failed", response=response)

    async def _keep_response(self, response: dict[str, Any]) -> None:
        if not self._keep:
            return
        items = [*map(with_id, self._conversation), *response["output"]]
        await self._endpoint.store.put(response["id"], StoredResponse(response, items))
