"""The one pattern every public endpoint follows: parse, admit once, one service call,
present.

An ``Endpoint`` names its path, its wire type (documented in ``/openapi.json``) and how a
decoded JSON body becomes a ``Prepared``: the typed frozen request the front door admits,
whether the answer streams, and the ``Presenter`` that makes the one service call and
renders what it returns. The edge (``gateway.edge.call.EndpointCall.serve``) runs these
steps in this order for every endpoint, with the same body limit, disconnect watch,
request record and error rendering. Adding an endpoint is one module in this package and
one line in ``gateway.app.build_app``'s list of endpoints.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from backends.base import BackendEvent, GenerationRequest, InvalidRequest
from gateway.errors import from_validation_error
from gateway.observe.record import RequestRecord
from gateway.service.generation import CompletionService, Generation, server_timing

_ModelT = TypeVar("_ModelT", bound=BaseModel)
AnswerT = TypeVar("AnswerT")


class Presenter(Protocol[AnswerT]):
    """Makes one request's service call and renders its answer. ``body`` and ``frames``
    each consume and close the answer; closing ``frames`` early closes it too."""

    async def open(self, request: GenerationRequest, record: RequestRecord) -> AnswerT:
        """The one service call, with the request as the front door admitted it."""
        ...

    async def body(self, answer: AnswerT) -> bytes: ...

    def frames(self, answer: AnswerT) -> AsyncGenerator[bytes, None]: ...

    def timing(self, answer: AnswerT) -> str:
        """The ``Server-Timing`` header's value."""
        ...


@dataclass(frozen=True, slots=True)
class Prepared(Generic[AnswerT]):
    """A parsed, translated request and how to answer it.

    ``request`` is what the front door admits and meters (once). ``generates``: a
    generation request, which is traced and carries the client's ``x-session-id``; an
    embedding call is metered by a stand-in request and does neither. ``wire_param``
    renames the ``param`` of an error raised in chat notation (by routing or a backend)
    into this endpoint's own field names.
    """

    request: GenerationRequest
    stream: bool
    presenter: Presenter[AnswerT]
    wire_param: Callable[[str], str] | None = None
    generates: bool = True


class Endpoint(ABC):
    """One public endpoint. Stateless per request; built once by the app."""

    path: ClassVar[str]
    wire: ClassVar[type[BaseModel]]
    summary: ClassVar[str]

    @abstractmethod
    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[Any]:
        """Parse the decoded JSON body into a typed request; raise ``ApiError`` on bad
        input (a 400 naming the ``param``)."""


class GenerationPresenter(ABC):
    """A presenter of one routed ``Generation``: opened through the completion service."""

    __slots__ = ("service",)

    def __init__(self, service: CompletionService) -> None:
        self.service = service

    async def open(self, request: GenerationRequest, record: RequestRecord) -> Generation:
        return await self.service.open(request, record)

    def timing(self, generation: Generation) -> str:
        return server_timing(generation)

    async def observed_events(self, generation: Generation) -> AsyncGenerator[BackendEvent, None]:
        """Every backend event, observed by the request record; closes the generation
        (for a presenter that renders events itself rather than through the service)."""
        record = generation.record
        try:
            async for event in generation.all_events():
                if event is not generation.first:
                    record.observe(event)
                yield event
        finally:
            await generation.close()
        self.service.observe_overhead(generation)

    @abstractmethod
    async def body(self, generation: Generation) -> bytes: ...

    @abstractmethod
    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]: ...


def parse_wire(model: type[_ModelT], body: Any) -> _ModelT:
    """Validate a decoded JSON body as ``model``; a failure is a 400 naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def parse_json(model: type[_ModelT], raw: bytes) -> _ModelT:
    """Decode a JSON request body and validate it as ``model`` (``parse_wire``); a body
    that is not JSON is a 400 too."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    return parse_wire(model, body)
