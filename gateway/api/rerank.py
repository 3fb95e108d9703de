"""``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``) and ``POST /v1/score`` (also
``/score``): the request and response shapes vLLM serves, turned into one
``backends.scoring.ScoreRequest`` for the scoring service and back.

Rerank is Cohere's and Jina's shape: a ``query`` and its ``documents`` (strings, or
objects with ``text``), answered with every document's ``relevance_score``, best first,
cut to ``top_n`` (absent or 0: all, as vLLM), each with its ``document`` unless
``return_documents`` is false. Score is vLLM's: ``text_1`` against ``text_2``, one to
one, one to many (``text_1`` a string or a one-item list) or many to many (equal-length
lists, pairwise), answered with one score per pair in ``text_2``'s order. Each accepts
at most ``MAX_DOCUMENTS`` texts a side, none empty.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from backends.base import InvalidRequest
from backends.scoring import ScoreRequest, ScoreResult
from gateway.api.base import Endpoint, Prepared, parse_wire
from gateway.api.whole import WholePresenter, metered
from gateway.api.wire import _Wire
from gateway.observe.ids import fresh_hex
from gateway.observe.record import RequestRecord
from gateway.service.scoring import ScoreService

MAX_DOCUMENTS = 1000


class RerankDocument(BaseModel):
    """A document as an object (Cohere's v1 and Jina's form); other fields are ignored."""

    model_config = ConfigDict(extra="allow", frozen=True)
    text: str


class RerankWire(_Wire):
    """The rerank request; unknown fields (``max_tokens_per_doc``...) are reported."""

    model: str = Field(min_length=1)
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(None, ge=0, description="How many results; 0 or absent: all.")
    return_documents: bool = Field(True, description="Include each result's document.")
    user: str | None = None


class ScoreWire(_Wire):
    """vLLM's score request; unknown fields are reported."""

    model: str = Field(min_length=1)
    text_1: str | list[str]
    text_2: str | list[str]
    user: str | None = None


def rerank_request(wire: RerankWire, request_id: str, arrival: float) -> ScoreRequest:
    documents = tuple(doc if isinstance(doc, str) else doc.text for doc in wire.documents)
    return ScoreRequest(
        request_id=request_id,
        model=wire.model,
        text_1=_texts(wire.query, "query"),
        text_2=_texts(documents, "documents"),
        rerank=True,
        arrival_time=arrival,
        user=wire.user,
    )


def score_request(wire: ScoreWire, request_id: str, arrival: float) -> ScoreRequest:
    first, second = _texts(wire.text_1, "text_1"), _texts(wire.text_2, "text_2")
    if len(first) != 1 and len(first) != len(second):
        raise InvalidRequest(
            f"text_1 has {len(first)} texts and text_2 {len(second)}: score one against "
            "one, one against many, or many against as many",
            param="text_1",
        )
    return ScoreRequest(
        request_id=request_id,
        model=wire.model,
        text_1=first,
        text_2=second,
        arrival_time=arrival,
        user=wire.user,
    )


def _texts(raw: str | list[str] | tuple[str, ...], param: str) -> tuple[str, ...]:
    """``raw`` as a tuple of texts, each non-empty, at most ``MAX_DOCUMENTS``."""
    if isinstance(raw, str):
        if not raw:
            raise InvalidRequest(f"{param} must not be empty", param=param)
        return (raw,)
    if not raw:
        raise InvalidRequest(f"{param} must not be empty", param=param)
    if len(raw) > MAX_DOCUMENTS:
        raise InvalidRequest(f"{param} holds more than {MAX_DOCUMENTS} texts", param=param)
    for index, text in enumerate(raw):
        if not text:
            raise InvalidRequest(f"{param}[{index}] must not be empty", param=f"{param}[{index}]")
    return tuple(raw)


def rerank_body(
    result: ScoreResult, request: ScoreRequest, *, model: str, top_n: int, documents: bool
) -> dict[str, Any]:
    """Results best first (ties in input order), cut to ``top_n`` (0: all)."""
    scores = result.scores
    order = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
    results: list[dict[str, Any]] = []
    for index in order[: top_n or None]:
        item: dict[str, Any] = {"index": index, "relevance_score": scores[index]}
        if documents:
            item["document"] = {"text": request.text_2[index]}
        results.append(item)
    tokens = result.prompt_tokens
    return {
        "id": f"rerank-{fresh_hex(16)}",
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


def score_body(result: ScoreResult, *, model: str) -> dict[str, Any]:
    tokens = result.prompt_tokens
    return {
        "id": f"score-{fresh_hex(16)}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [
            {"index": index, "object": "score", "score": score}
            for index, score in enumerate(result.scores)
        ],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


def _rerank_param(param: str) -> str:
    """A scoring error's field in rerank's names (``text_2[3]`` is ``documents[3]``)."""
    for scored, asked in (("text_1", "query"), ("text_2", "documents")):
        if param.startswith(scored):
            return asked + param.removeprefix(scored)
    return param


def _stand_in(request: ScoreRequest) -> str:
    return "\n".join(request.text_1 + request.text_2)


class RerankEndpoint(Endpoint):
    path = "/v1/rerank"
    wire = RerankWire
    summary = "Rerank documents by relevance to a query (Cohere / Jina shape, as vLLM)"

    def __init__(self, service: ScoreService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[dict[str, Any]]:
        wire = parse_wire(RerankWire, body)
        record.requested_model = wire.model
        request = rerank_request(wire, record.request_id, record.arrival_time)
        top_n, documents = wire.top_n or 0, wire.return_documents

        async def answer(record: RequestRecord) -> dict[str, Any]:
            result, model = await self._service.score(request, record)
            return rerank_body(result, request, model=model, top_n=top_n, documents=documents)

        stand_in = metered(
            record.request_id, wire.model, record.arrival_time, prompt=_stand_in(request)
        )
        return Prepared(stand_in, False, WholePresenter(answer), _rerank_param, generates=False)


class RerankRootEndpoint(RerankEndpoint):
    path = "/rerank"


class RerankV2Endpoint(RerankEndpoint):
    path = "/v2/rerank"
    summary = "Rerank documents by relevance to a query (Cohere v2 client path)"


class ScoreEndpoint(Endpoint):
    path = "/v1/score"
    wire = ScoreWire
    summary = "Score text pairs: one to one, one to many, many to many (vLLM shape)"

    def __init__(self, service: ScoreService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[dict[str, Any]]:
        wire = parse_wire(ScoreWire, body)
        record.requested_model = wire.model
        request = score_request(wire, record.request_id, record.arrival_time)

        async def answer(record: RequestRecord) -> dict[str, Any]:
            result, model = await self._service.score(request, record)
            return score_body(result, model=model)

        stand_in = metered(
            record.request_id, wire.model, record.arrival_time, prompt=_stand_in(request)
        )
        return Prepared(stand_in, False, WholePresenter(answer), generates=False)


class ScoreRootEndpoint(ScoreEndpoint):
    path = "/score"


def scoring_endpoints(service: ScoreService) -> tuple[Endpoint, ...]:
    """Every rerank and score path, each answered the same way as vLLM answers it."""
    return (
        RerankEndpoint(service),
        RerankRootEndpoint(service),
        RerankV2Endpoint(service),
        ScoreEndpoint(service),
        ScoreRootEndpoint(service),
    )
