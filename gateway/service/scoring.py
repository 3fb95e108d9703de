"""The scoring service: routes a ``ScoreRequest`` to a model that scores pairs.

The request is parsed at the edge (``gateway.api.rerank``); routed like generation
(``routed``); the routed backend must declare ``Feature.SCORE``
(``gateway.service.capabilities``, a 400 naming ``model`` otherwise). Each request is one
``RequestRecord``: prompt tokens in, zero generated, like an embedding request. The
service is stateless; the edge renders the scores as a rerank or a score answer.
"""

from __future__ import annotations

from dataclasses import replace

from backends.base import BackendError, Started, Usage
from backends.scoring import ScoreRequest, ScoreResult
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import RequestRecord
from gateway.registry import ModelRegistry
from gateway.registry.split import SplitKey
from gateway.service.capabilities import require_scorer
from gateway.service.routed import on_first_candidate


class ScoreService:
    """Routes one ``ScoreRequest``; answers its scores and the model that made them."""

    def __init__(self, registry: ModelRegistry, metrics: GatewayMetrics) -> None:
        self._registry = registry
        self._metrics = metrics

    async def score(self, request: ScoreRequest, record: RequestRecord) -> tuple[ScoreResult, str]:
        return await on_first_candidate(
            self._registry,
            request.model,
            record,
            lambda name: self._on(name, request, record),
            SplitKey(request.request_id, request.user),
        )

    async def _on(self, name: str, request: ScoreRequest, record: RequestRecord) -> ScoreResult:
        async with self._registry.lease(name) as lease:
            scorer = require_scorer(lease.backend, name, lease.backend.info())
            record.bind(name, lease.config.backend, self._metrics, lease.config.pricing)
            result = await scorer.score(replace(request, model=name))
        if len(result.scores) != len(request.text_2):
            raise BackendError(
                f"model {name!r} returned {len(result.scores)} scores for "
                f"{len(request.text_2)} pairs"
            )
        if result.started_at:
            record.observe(Started(queued_at=result.queued_at, started_at=result.started_at))
        record.observe(Usage(result.prompt_tokens, 0, upstream_seconds=result.upstream_seconds))
        return result
