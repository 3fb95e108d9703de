"""``POST /v1/embeddings``: the wire body to a ``backends.embeddings.EmbeddingRequest``,
one call of the embedding service, its ``CreateEmbeddingResponse`` back.

The front door admits an embedding call as a stand-in generation request (its inputs as
the prompt, no completion tokens); the settlement then counts the real prompt tokens.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Literal

import orjson
from pydantic import Field

from backends.base import (
    GenerationRequest,
    InvalidRequest,
    RequestKind,
    SamplingParams,
    UnsupportedFeature,
)
from backends.embeddings import EmbeddingRequest
from gateway.api.base import Endpoint, Prepared, parse_wire
from gateway.api.wire import _Wire
from gateway.observe.record import RequestRecord
from gateway.service.embeddings import EmbeddingService

MAX_INPUTS = 2048


class EmbeddingsWire(_Wire):
    """``CreateEmbeddingRequest``: only the fields we honour; others are reported."""

    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


def embedding_request(wire: EmbeddingsWire, request_id: str, arrival: float) -> EmbeddingRequest:
    texts, token_ids = _inputs(wire.input)
    return EmbeddingRequest(
        request_id=request_id,
        model=wire.model,
        texts=texts,
        token_ids=token_ids,
        dimensions=wire.dimensions,
        arrival_time=arrival,
        user=wire.user,
    )


def _inputs(
    raw: str | list[str] | list[int] | list[list[int]],
) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    items: list[Any] = [raw] if isinstance(raw, str) else list(raw)
    if not items:
        raise InvalidRequest("input must not be empty", param="input")
    if isinstance(items[0], int):  # a single token-id list
        items = [items]
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(f"input holds more than {MAX_INPUTS} items", param="input")
    if isinstance(items[0], str):
        for index, text in enumerate(items):
            if not text:
                raise InvalidRequest("input strings must not be empty", param=f"input[{index}]")
        return tuple(items), ()
    for index, ids in enumerate(items):
        if not ids:
            raise InvalidRequest("token-id lists must not be empty", param=f"input[{index}]")
        if min(ids) < 0:
            raise InvalidRequest("token ids must not be negative", param=f"input[{index}]")
    return (), tuple(tuple(ids) for ids in items)


def _metered(request: EmbeddingRequest) -> GenerationRequest:
    """What the front door meters for an embedding call: its inputs as the prompt and no
    completion tokens (the settlement then counts the real prompt tokens)."""
    return GenerationRequest(
        request_id=request.request_id,
        model=request.model,
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=1),
        prompt="\n".join(request.texts),
        prompt_token_ids=tuple(token for ids in request.token_ids for token in ids),
        arrival_time=request.arrival_time,
        user=request.user,
    )


class EmbeddingPresenter:
    """One embedding call and its JSON body; owned by the task serving the request."""

    __slots__ = ("_encoding", "_record", "_request", "_service")

    def __init__(self, service: EmbeddingService, request: EmbeddingRequest, encoding: str) -> None:
        self._service = service
        self._request = request
        self._encoding = encoding
        self._record: RequestRecord | None = None

    async def open(self, request: GenerationRequest, record: RequestRecord) -> dict[str, Any]:
        """``request`` is the admitted stand-in; the embedding request is served."""
        self._record = record
        return await self._service.embed(self._request, record, self._encoding)

    async def body(self, answer: dict[str, Any]) -> bytes:
        return orjson.dumps(answer)

    def frames(self, answer: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        raise UnsupportedFeature("embeddings are not streamed", param="stream")

    def timing(self, answer: dict[str, Any]) -> str:
        elapsed = self._record.elapsed if self._record is not None else 0.0
        return f"total;dur={elapsed * 1000.0:.2f}"


class EmbeddingsEndpoint(Endpoint):
    path = "/v1/embeddings"
    wire = EmbeddingsWire
    summary = "Create embeddings"

    def __init__(self, service: EmbeddingService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[dict[str, Any]]:
        wire = parse_wire(EmbeddingsWire, body)
        request = embedding_request(wire, record.request_id, record.arrival_time)
        presenter = EmbeddingPresenter(self._service, request, wire.encoding_format)
        return Prepared(_metered(request), False, presenter, generates=False)
