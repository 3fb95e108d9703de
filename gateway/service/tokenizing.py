"""The tokenizer service: routes a ``TokenizeRequest`` or ``DetokenizeRequest`` to a model
that tokenizes.

Parsed at the edge (``gateway.api.tokenize``); routed like generation (``routed``); the
routed backend must declare ``Feature.TOKENIZE`` (``gateway.service.capabilities``, a 400
naming ``model`` otherwise). No model runs, so the record counts no prompt tokens: the
request shows in the request log and metrics under its route with zero tokens. Stateless.
"""

from __future__ import annotations

from dataclasses import replace

from backends.tokenizing import DetokenizeRequest, TextTokenizer, TokenizeRequest, TokenizeResult
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import RequestRecord
from gateway.registry import Lease, ModelRegistry
from gateway.registry.split import SplitKey
from gateway.service.capabilities import require_tokenizer
from gateway.service.routed import on_first_candidate


class TokenizeService:
    """Routes one tokenize or detokenize call; answers it with the model's name."""

    def __init__(self, registry: ModelRegistry, metrics: GatewayMetrics) -> None:
        self._registry = registry
        self._metrics = metrics

    async def tokenize(
        self, request: TokenizeRequest, record: RequestRecord
    ) -> tuple[TokenizeResult, str]:
        async def on(name: str) -> TokenizeResult:
            async with self._registry.lease(name) as lease:
                tokenizer = self._bound(lease, record)
                return await tokenizer.tokenize(replace(request, model=name))

        return await on_first_candidate(
            self._registry, request.model, record, on, SplitKey(request.request_id)
        )

    async def detokenize(
        self, request: DetokenizeRequest, record: RequestRecord
    ) -> tuple[str, str]:
        async def on(name: str) -> str:
            async with self._registry.lease(name) as lease:
                tokenizer = self._bound(lease, record)
                return await tokenizer.detokenize(replace(request, model=name))

        return await on_first_candidate(
            self._registry, request.model, record, on, SplitKey(request.request_id)
        )

    def _bound(self, lease: Lease, record: RequestRecord) -> TextTokenizer:
        """The leased backend as a tokenizer (or the 400), with the record bound to it."""
        tokenizer = require_tokenizer(lease.backend, lease.name, lease.backend.info())
        record.bind(lease.name, lease.config.backend, self._metrics)
        return tokenizer
