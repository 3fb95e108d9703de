"""The embedding half of the backend contract: what ``/v1/embeddings`` hands a backend.

A backend that serves embeddings declares ``Feature.EMBEDDINGS`` in ``info()`` and
implements ``Embedder.embed``. Inputs are either texts or token-id lists (never both);
the result holds one vector per input, in input order, and the prompt token count.
Plain frozen data, like ``backends.base``: backends never see HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

DEFAULT_EMBED_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """One validated embedding call.

    Exactly one of ``texts`` and ``token_ids`` is non-empty. ``dimensions`` asks for
    vectors cut to that length (and renormalised where the model normalises); ``None``
    keeps the model's own size. ``timeout`` bounds the whole call, queueing included.
    """

    request_id: str
    model: str
    texts: tuple[str, ...] = ()
    token_ids: tuple[tuple[int, ...], ...] = ()
    dimensions: int | None = None
    arrival_time: float = 0.0
    user: str | None = None
    timeout: float = DEFAULT_EMBED_TIMEOUT_S

    @property
    def size(self) -> int:
        return len(self.texts) or len(self.token_ids)


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    """One vector per input, in input order. Times are ``time.time()`` values;
    ``upstream_seconds`` is the wait on an external server (``None`` in-process)."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int
    queued_at: float = 0.0
    started_at: float = 0.0
    upstream_seconds: float | None = None


@runtime_checkable
class Embedder(Protocol):
    """The optional method of a backend that declares ``Feature.EMBEDDINGS``.

    ``embed`` runs on the event loop and must not block it; cancelling the awaiting task
    (the client left) must drop the work if it has not started. It raises the contract's
    ``BackendError`` subclasses (``InvalidRequest`` naming ``input`` or ``dimensions``,
    ``Overloaded`` when its queue is full, ``UpstreamTimeout`` past ``timeout``).
    """

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult: ...
