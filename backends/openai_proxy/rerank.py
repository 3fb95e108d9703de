"""Relay one ``ScoreRequest`` to an upstream's ``/score`` or ``/rerank`` (vLLM's shapes,
which llama.cpp's ``/rerank`` shares). Pure functions; retries, the breaker and
concurrency slots stay in ``OpenAIProxyBackend``.

A request the client sent to ``/rerank`` (one query) goes to the upstream's ``/rerank``
without ``top_n``, so every document comes back scored and the gateway sorts and cuts
itself; everything else goes to ``/score``. Both answers are read back into one score
per pair, in the documents' order.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import UpstreamBadResponse
from backends.scoring import ScoreRequest

SCORE_PATH = "/score"
RERANK_PATH = "/rerank"


def score_body(request: ScoreRequest, upstream_model: str) -> tuple[str, bytes]:
    """``(path under the server root, JSON body)`` for ``request``."""
    if request.rerank and len(request.text_1) == 1:
        rerank = {"model": upstream_model, "query": request.text_1[0], "documents": request.text_2}
        return RERANK_PATH, orjson.dumps(rerank)
    first: str | tuple[str, ...] = request.text_1
    if len(request.text_1) == 1:
        first = request.text_1[0]  # one against many, as vLLM reads a string
    body = {"model": upstream_model, "text_1": first, "text_2": request.text_2}
    return SCORE_PATH, orjson.dumps(body)


def parse_scores(payload: Any, path: str, expected: int) -> tuple[tuple[float, ...], int | None]:
    """``(one score per pair in order, the upstream's prompt tokens or None)``; raises
    ``UpstreamBadResponse`` for an answer that does not score every pair once."""
    key, value = ("results", "relevance_score") if path == RERANK_PATH else ("data", "score")
    try:
        items = payload[key]
        by_index = {int(item["index"]): float(item[value]) for item in items}
    except (KeyError, TypeError, ValueError):
        raise UpstreamBadResponse(f"upstream {path} answer has no usable {key}") from None
    if len(items) != expected or sorted(by_index) != list(range(expected)):
        raise UpstreamBadResponse(f"upstream {path} scored {len(items)} items for {expected} pairs")
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = None
    if isinstance(usage, dict):
        tokens = usage.get("prompt_tokens", usage.get("total_tokens"))
    return tuple(by_index[i] for i in range(expected)), tokens if isinstance(tokens, int) else None
