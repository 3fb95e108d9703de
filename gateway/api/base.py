"""What an endpoint served by ``gateway.edge.asgi.GenerationCall`` supplies.

Every generation route shares one call machinery (body limit, disconnect watcher, request
record, metrics, error rendering); what differs per endpoint is how its wire body becomes
a ``GenerationRequest`` (``prepare``) and how the routed ``Generation`` is rendered back
(a ``Presenter``). Chat and completions use ``ChatPresenter``; ``/v1/responses`` brings
its own (``gateway.api.responses``).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from backends.base import GenerationRequest, InvalidRequest
from gateway.errors import from_validation_error
from gateway.service.generation import CompletionService, Generation

_ModelT = TypeVar("_ModelT", bound=BaseModel)


class Presenter(Protocol):
    """Renders one routed generation; each method consumes and closes it."""

    async def body(self, generation: Generation) -> bytes: ...

    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        """SSE frames; closing the iterator early closes the generation."""
        ...


@dataclass(frozen=True, slots=True)
class Prepared:
    """A parsed, translated request and how to answer it. ``wire_param`` renames the
    ``param`` of an error raised in chat notation (by routing or a backend) into this
    endpoint's own field names."""

    request: GenerationRequest
    stream: bool
    presenter: Presenter
    wire_param: Callable[[str], str] | None = None


Prepare = Callable[[Any], Awaitable[Prepared]]
"""Turns the decoded JSON body into a ``Prepared``; raises ``ApiError`` on bad input."""


class ChatPresenter:
    """Chat completion and legacy completion bodies and chunks, from the service."""

    __slots__ = ("_include_usage", "_legacy", "_service")

    def __init__(
        self, service: CompletionService, include_usage: bool, *, legacy_functions: bool = False
    ) -> None:
        self._service = service
        self._include_usage = include_usage
        self._legacy = legacy_functions

    async def body(self, generation: Generation) -> bytes:
        return orjson.dumps(await self._service.complete(generation, self._legacy))

    def frames(self, generation: Generation) -> AsyncGenerator[bytes, None]:
        return self._service.stream(generation, self._include_usage, self._legacy)


def parse_wire(model: type[_ModelT], body: Any) -> _ModelT:
    """Validate a decoded JSON body as ``model``; a failure is a 400 naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None
