"""One whole call (embeddings, scores, tokens) routed like generation: the requested
name, alias or ``capability:``, the key's allowed models, and fallbacks while the
candidate is busy or not ready (nothing has been sent to the client yet). Stateless.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.access.keys import allowed_candidates
from gateway.observe.record import RequestRecord
from gateway.registry import ModelRegistry
from gateway.registry.split import SplitKey
from gateway.service.generation import FALLBACK_ERRORS

T = TypeVar("T")


async def on_first_candidate(
    registry: ModelRegistry,
    requested: str,
    record: RequestRecord,
    call: Callable[[str], Awaitable[T]],
    key: SplitKey | None = None,
) -> tuple[T, str]:
    """``call(model)`` on the first candidate that answers, with the model's name; a
    fallback is recorded on the registry and the request's record. A split route picks its
    target by ``key`` (session, ``user``, else the request id). Raises routing's
    ``ModelNotFound`` and the last candidate's error."""
    decision = registry.route(requested, key, record.may_use)
    candidates = allowed_candidates(requested, decision.candidates, record.may_use)
    if decision.route is not None:
        registry.record_split(decision)
        record.route = decision.route
    for position, name in enumerate(candidates):
        try:
            return await call(name), name
        except FALLBACK_ERRORS as exc:
            if position + 1 >= len(candidates):
                raise
            registry.record_fallback(name, candidates[position + 1], type(exc).__name__)
            record.fallback_from.append(name)
    raise AssertionError("route() returned no candidates")
