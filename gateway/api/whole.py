"""What the endpoints that answer one whole JSON body without generating share (rerank,
score, tokenize): the request the front door meters for them, and their presenter.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import orjson

from backends.base import (
    GenerationRequest,
    RequestKind,
    SamplingParams,
    UnsupportedFeature,
)
from gateway.observe.record import RequestRecord

Answer = Callable[[RequestRecord], Awaitable[dict[str, Any]]]
"""The one service call of a request, rendered as its JSON body."""


def metered(
    request_id: str, model: str, arrival: float, *, prompt: str = "", user: str | None = None
) -> GenerationRequest:
    """What the front door admits and meters for such a call: ``prompt`` (the texts a
    model will read, "" for none) and no completion tokens; the settlement then counts
    the real prompt tokens the record observed."""
    return GenerationRequest(
        request_id=request_id,
        model=model,
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=0),
        prompt=prompt,
        arrival_time=arrival,
        user=user,
    )


class WholePresenter:
    """Makes one whole answer and its body; owned by the task serving the request."""

    __slots__ = ("_answer", "_record")

    def __init__(self, answer: Answer) -> None:
        self._answer = answer
        self._record: RequestRecord | None = None

    async def open(self, request: GenerationRequest, record: RequestRecord) -> dict[str, Any]:
        """``request`` is the admitted stand-in; the parsed request is in ``answer``."""
        self._record = record
        return await self._answer(record)

    async def body(self, answer: dict[str, Any]) -> bytes:
        return orjson.dumps(answer)

    def frames(self, answer: dict[str, Any]) -> AsyncGenerator[bytes, None]:
        raise UnsupportedFeature("this endpoint does not stream", param="stream")

    def timing(self, answer: dict[str, Any]) -> str:
        elapsed = self._record.elapsed if self._record is not None else 0.0
        return f"total;dur={elapsed * 1000.0:.2f}"
