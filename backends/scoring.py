"""The scoring half of the backend contract: what ``/v1/score`` and ``/v1/rerank`` hand a
backend.

A backend that scores text pairs declares ``Feature.SCORE`` in ``info()`` and implements
``Scorer.score``. A request holds two lists of texts: ``text_1`` has one item, scored
against every item of ``text_2`` (a query and its documents), or as many items as
``text_2``, scored pairwise. The result holds one score per pair, in ``text_2``'s order,
and the prompt tokens the model read. How a score is made is the backend's: the cosine
of two embeddings for an embedding model, the classification head's output for a
cross-encoder, the upstream's own number for a relay. Plain frozen data, like
``backends.base``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

DEFAULT_SCORE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ScoreRequest:
    """One validated scoring call: ``len(text_1)`` is 1 or ``len(text_2)`` (checked at
    the edge), no text is empty. ``rerank``: the client asked ``/rerank`` (a relay sends
    it to the upstream's ``/rerank``, else to its ``/score``); the scores mean the same.
    ``timeout`` bounds the whole call, queueing included."""

    request_id: str
    model: str
    text_1: tuple[str, ...]
    text_2: tuple[str, ...]
    rerank: bool = False
    arrival_time: float = 0.0
    user: str | None = None
    timeout: float = DEFAULT_SCORE_TIMEOUT_S

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """Every scored pair, in ``text_2``'s order."""
        firsts = self.text_1 * len(self.text_2) if len(self.text_1) == 1 else self.text_1
        return tuple(zip(firsts, self.text_2, strict=True))


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """One score per pair, in ``text_2``'s order. Times are ``time.time()`` values;
    ``upstream_seconds`` is the wait on an external server (``None`` in-process)."""

    scores: tuple[float, ...]
    prompt_tokens: int
    queued_at: float = 0.0
    started_at: float = 0.0
    upstream_seconds: float | None = None


@runtime_checkable
class Scorer(Protocol):
    """The optional method of a backend that declares ``Feature.SCORE``.

    ``score`` runs on the event loop and must not block it; cancelling the awaiting task
    (the client left) drops the work where it has not started. It raises the contract's
    ``BackendError`` subclasses (``InvalidRequest`` naming ``text_1``/``text_2``,
    ``Overloaded`` when its queue is full, ``UpstreamTimeout`` past ``timeout``).
    """

    async def score(self, request: ScoreRequest) -> ScoreResult: ...
