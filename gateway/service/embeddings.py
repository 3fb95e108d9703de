"""The embedding service: routes an ``EmbeddingRequest`` and builds the response body.

The request is parsed at the edge (``gateway.api.embeddings``); routed like generation
(exact name, alias, ``capability:``, a split route's target by request id or ``user``,
fallbacks while nothing was sent; never mirrored: ``routed``); the routed backend must declare
``Feature.EMBEDDINGS`` (``gateway.service.capabilities``). Each request is one
``RequestRecord``, so it shows in the metrics and the request log like a generation
request (prompt tokens in, zero generated). The service is stateless.
"""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import numpy as np

from backends.base import BackendError, Started, Usage
from backends.embeddings import EmbeddingRequest, EmbeddingResult
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import RequestRecord
from gateway.registry import ModelRegistry
from gateway.registry.split import SplitKey
from gateway.service.capabilities import require_embeddings
from gateway.service.routed import on_first_candidate


class EmbeddingService:
    """Routes one ``EmbeddingRequest`` and builds the ``CreateEmbeddingResponse``."""

    def __init__(self, registry: ModelRegistry, metrics: GatewayMetrics) -> None:
        self._registry = registry
        self._metrics = metrics

    async def embed(
        self, request: EmbeddingRequest, record: RequestRecord, encoding: str
    ) -> dict[str, Any]:
        result, name = await on_first_candidate(
            self._registry,
            request.model,
            record,
            lambda name: self._embed_on(name, request, record),
            SplitKey(request.request_id, request.user),
        )
        return response_body(result, model=name, encoding=encoding)

    async def _embed_on(
        self, name: str, request: EmbeddingRequest, record: RequestRecord
    ) -> EmbeddingResult:
        async with self._registry.lease(name) as lease:
            embedder = require_embeddings(lease.backend, name, lease.backend.info())
            record.bind(name, lease.config.backend, self._metrics, lease.config.pricing)
            result = await embedder.embed(replace(request, model=name))
        if len(result.vectors) != request.size:
            raise BackendError(
                f"model {name!r} returned {len(result.vectors)} vectors for {request.size} inputs"
            )
        if result.started_at:
            record.observe(Started(queued_at=result.queued_at, started_at=result.started_at))
        record.observe(Usage(result.prompt_tokens, 0, upstream_seconds=result.upstream_seconds))
        return result


def response_body(result: EmbeddingResult, *, model: str, encoding: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": _encode(vector, encoding)}
            for index, vector in enumerate(result.vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
    }


def _encode(vector: tuple[float, ...], encoding: str) -> list[float] | str:
    if encoding == "base64":
        # OpenAI's base64 form: little-endian float32, what the SDKs decode.
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return list(vector)
