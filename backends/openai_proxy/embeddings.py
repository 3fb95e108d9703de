"""Relay one ``EmbeddingRequest`` to an upstream's ``/v1/embeddings``. Pure I/O helpers;
retries, the breaker and concurrency slots stay in ``OpenAIProxyBackend.embed``.

We ask for ``float`` vectors: every OpenAI-compatible engine serves that form, and the
gateway re-encodes for its own client (float or base64) anyway.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from backends.base import BackendError, UpstreamBadResponse, UpstreamRejected
from backends.embeddings import EmbeddingRequest
from backends.openai_proxy.relay import _label, post_json

EMBEDDINGS_PATH = "/embeddings"


def embeddings_body(request: EmbeddingRequest, upstream_model: str) -> bytes:
    body: dict[str, Any] = {
        "model": upstream_model,
        "input": list(request.texts) if request.texts else [list(i) for i in request.token_ids],
        "encoding_format": "float",
    }
    if request.dimensions is not None:
        body["dimensions"] = request.dimensions
    if request.user is not None:
        body["user"] = request.user
    return orjson.dumps(body)


async def post_embeddings(
    session: aiohttp.ClientSession, url: str, body: bytes, expected: int
) -> tuple[tuple[tuple[float, ...], ...], int | None]:
    """``(vectors in input order, upstream prompt token count or None)``; raises the
    contract's errors for failed, refused or malformed answers."""
    return parse_embeddings(await post_json(session, url, body), expected)


def parse_embeddings(
    payload: Any, expected: int
) -> tuple[tuple[tuple[float, ...], ...], int | None]:
    try:
        items = sorted(payload["data"], key=lambda item: int(item["index"]))
        vectors = tuple(tuple(float(x) for x in item["embedding"]) for item in items)
    except (KeyError, TypeError, ValueError):
        raise UpstreamBadResponse("upstream embeddings answer has no usable data") from None
    if len(vectors) != expected:
        raise UpstreamBadResponse(f"upstream returned {len(vectors)} vectors for {expected} inputs")
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return vectors, tokens if isinstance(tokens, int) else None


def outcome_label(error: BackendError) -> str:
    """The ``upstream_requests`` status label of a failed attempt, as streams count it."""
    return str(error.status) if isinstance(error, UpstreamRejected) else _label(error)
