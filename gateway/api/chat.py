"""``POST /v1/chat/completions``: the chat wire body to a ``GenerationRequest``, chat
completion bodies and chunks back (``gateway.service.chat_bodies``)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson

from gateway.api.base import Endpoint, GenerationPresenter, Prepared, parse_wire
from gateway.api.translate import chat_request, report_unknown_fields
from gateway.api.wire import ChatCompletionRequest
from gateway.observe.record import RequestRecord
from gateway.service.generation import CompletionService, Generation


class ChatPresenter(GenerationPresenter):
    """Chat completion and legacy completion bodies and chunks, from the service."""

    __slots__ = ("_include_usage", "_legacy")

    def __init__(
        self, service: CompletionService, include_usage: bool, *, legacy_functions: bool = False
    ) -> None:
        super().__init__(service)
        self._include_usage = include_usage
        self._legacy = legacy_functions

    async def body(self, generation: Generation) -> bytes:
        return orjson.dumps(await self.service.complete(generation, self._legacy))

    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        return self.service.stream(generation, self._include_usage, self._legacy)


class ChatEndpoint(Endpoint):
    path = "/v1/chat/completions"
    wire = ChatCompletionRequest
    summary = "Create a chat completion"

    def __init__(self, service: CompletionService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Generation]:
        wire = parse_wire(ChatCompletionRequest, body)
        report_unknown_fields(wire, record.request_id)
        record.requested_model = wire.model  # known even when translate refuses
        request = chat_request(wire, record.request_id, record.arrival_time)
        include_usage = bool(wire.stream_options and wire.stream_options.include_usage)
        # A legacy `functions` request is answered in its own shape (`function_call`).
        presenter = ChatPresenter(
            self._service, include_usage, legacy_functions=bool(wire.functions)
        )
        return Prepared(request, wire.stream, presenter)
