"""Admission: who may run what, and how much, decided once per request.

``Admission`` (one per app) holds the client key ring, the limit store and the per-key
metrics. Each request, online or a batch line, gets a ``Ticket``: ``identify`` names
its client key, ``admit`` sets the request's priority (the one it asked for, within the
key's range, else the key's) and tenant (the key and its fair-share weight), checks the
key's model allow-list and takes the request's share of its limits, all or nothing (a
refusal is a typed 400/429/503 and consumes no allowance), and ``finish`` settles the
reservation against the tokens really used, charges the request's cost to the key's spend
budget, and counts the request (and its cost) per key. Nothing here reads HTTP: the edge
(``gateway.edge.door``) finds the presented key, and shows a ticket's ``Verdict`` as
OpenAI's ``x-ratelimit-*`` headers.

``Admission`` is owned by the app; ``reconfigure`` swaps in a new key ring on reload.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from backends.base import ApiError, GenerationRequest
from config.schema import AppConfig
from gateway.access.errors import BudgetExceeded, QuotaExceeded, RateLimited
from gateway.access.keys import (
    ANONYMOUS,
    OPEN_DOOR,
    UNAUTHENTICATED,
    Client,
    KeyRing,
    NamedAdapter,
    allowed_candidates,
    not_found,
)
from gateway.access.limits import Ask, KeyLimits, Settlement, Verdict
from gateway.access.metrics import KeyMetrics
from gateway.access.store import GuardedStore, Store, open_store
from gateway.observe.cost import usd_text
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.record import FinishSink, RequestRecord
from gateway.registry import ModelRegistry
from gateway.registry.split import SplitKey

log = logging.getLogger(__name__)

_REFUSALS = {
    "rpm": "Rate limit reached for requests per minute",
    "tpm": "Rate limit reached for tokens per minute",
    "parallel": "Too many requests in flight for this key",
}
_PERIODIC = {"day": "daily", "week": "weekly", "month": "monthly"}


class Admission:
    def __init__(
        self,
        config: AppConfig,
        registry: ModelRegistry,
        metrics: GatewayMetrics,
        prometheus: CollectorRegistry,
        store: Store | None = None,
    ) -> None:
        """``store``: the limit store to use instead of the one ``limits.store`` names
        (a fleet's worker: its supervisor's)."""
        self.keys = KeyRing(config.auth)
        self.key_metrics = KeyMetrics(prometheus)
        self.store = GuardedStore(
            store or open_store(config.limits), config.limits, self.key_metrics
        )
        self.unset_max_tokens = config.limits.unset_max_tokens
        self.registry = registry
        self._metrics = metrics
        # Handed every record a ticket finishes (the console's stats window); the app
        # appends to it once, at build time.
        self.finish_sinks: list[FinishSink] = []

    def reconfigure(self, config: AppConfig) -> None:
        """Apply a reloaded config's keys (the store needs a restart)."""
        self.keys = KeyRing(config.auth)
        log.info("client keys reloaded: %d key(s)", len(self.keys.names))

    async def close(self) -> None:
        await self.store.close()

    def open(self, record: RequestRecord, client: Client | None = None) -> Ticket:
        """The ticket of the request ``record`` describes: from here on it is counted and
        logged when it finishes, refused or not. ``client``: already identified (a batch
        line runs as the key that created its batch)."""
        record.track(self._metrics, self.finish_sinks)
        ticket = Ticket(self, record)
        if client is not None:
            ticket.identify(client)
        return ticket

    def client_named(self, name: str) -> Client | None:
        """The client key configured under ``name`` now (a batch runs as the key that
        created it); ``None`` if it was removed since."""
        if not self.keys.required:
            return OPEN_DOOR if name == ANONYMOUS else None
        return next((c for c in self.keys.clients() if c.name == name), None)

    def model_filter(self, client: Client) -> Callable[[str], bool] | None:
        """``RequestRecord.may_use`` for ``client``: the routers of every route skip the
        models it returns False for (``keys.allowed_candidates``). An allow-list entry
        naming a split route grants the route's targets, as one naming an alias grants its
        model. Reads the registry's config at call time, so it follows reloads."""
        allowed = client.models
        if allowed is None:
            return None
        registry = self.registry

        def may_use(name: str) -> bool:
            if any(name in registry.splits.targets(entry) for entry in allowed):
                return True
            for model in registry.config.models:
                if model.name == name:
                    return client.may_use(model)
                for adapter in getattr(model, "adapters", ()):
                    if adapter.name == name:
                        own = NamedAdapter(adapter.name, adapter.aliases)
                        return client.may_use_adapter(model, own)
            return False

        return may_use


class Ticket:
    """One request's way through admission. Owned by the task serving the request."""

    def __init__(self, admission: Admission, record: RequestRecord) -> None:
        self._admission = admission
        self.record = record
        self.client: Client | None = None
        self.verdict: Verdict | None = None
        self._ask: Ask | None = None
        self._prompt_estimate = 0

    def identify(self, client: Client) -> None:
        """The request runs as ``client``: its record names the key and skips the models
        the key may not use."""
        self.client = client
        self.record.key = client.name
        self.record.may_use = self._admission.model_filter(client)

    async def admit(self, request: GenerationRequest) -> GenerationRequest:
        """``request`` as its key may run it (its priority: the one it asked for within
        the key's range, else the key's; the key as its tenant), once the key's model
        allow-list and limits let it in; raises the refusal otherwise."""
        client = self.client
        if client is None:
            return request
        priority = client.priority_of(request.asked_priority)
        if self.record.may_use is not None:  # refuse early, before taking any allowance
            self._check_model(request, self.record.may_use)
        request = replace(request, priority=priority, tenant=client.tenant)
        # Kept on the record too: what a stream cut before its usage is billed.
        self._prompt_estimate = self.record.prompt_estimate = estimate_prompt_tokens(request)
        if not client.limited:
            return request
        sampling = request.sampling
        completion = sampling.max_tokens
        if completion is None:
            completion = self._admission.unset_max_tokens
        cost = self._prompt_estimate + completion * sampling.n
        ask = Ask(client.name, client.limits, cost, f"{request.request_id}-{secrets.token_hex(4)}")
        verdict = await self._admission.store.admit(ask)
        self.verdict = verdict
        if not verdict.allowed:
            raise _refusal(verdict, cost, client.limits)
        if verdict.reason is None:
            self._ask = ask
        return request

    def _check_model(self, request: GenerationRequest, may_use: Callable[[str], bool]) -> None:
        requested = request.model
        key = SplitKey(request.request_id, request.user)  # a split picks among allowed targets
        try:
            decision = self._admission.registry.route(requested, key, may_use)
        except ApiError:
            raise not_found(requested) from None
        allowed_candidates(requested, decision.key_checks, may_use)

    async def standing(self) -> Verdict | None:
        """Where the key stands against its limits: the admission's verdict, else (a
        request refused before it, or never admitted) the store's current one; ``None``
        for a key without limits, or while the store is down."""
        client = self.client
        if client is not None and self.verdict is None and client.limited:
            self.verdict = await self._admission.store.peek(client.name, client.limits)
        return self.verdict

    async def finish(self) -> None:
        """Settle the reservation against the tokens used, finish the record, and count
        the request and its tokens per key. Once, whatever happened to the request."""
        record = self.record
        usage_known = record.input_tokens > 0
        prompt = record.input_tokens if usage_known else 0
        completion = record.output_tokens if usage_known else record.streamed_tokens
        cost = record.cost()
        ask = self._ask
        if ask is not None:
            spent = prompt + completion if usage_known else self._prompt_estimate + completion
            day = self.verdict.day if self.verdict is not None else ""
            settlement = Settlement(
                ask.key, ask.limits, ask.lease, day, spent - ask.cost, cost or 0
            )
            await self._admission.store.settle(settlement)
        record.finish()
        name = self.client.name if self.client is not None else UNAUTHENTICATED
        metrics = self._admission.key_metrics
        metrics.observe(name, record.status, prompt, completion)
        if cost is not None:
            metrics.charge(name, record.model, cost)


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """An upper-ish estimate without a tokenizer (about 4 bytes per token, plus framing);
    the settlement replaces it with the backend's real count."""
    size = len(request.prompt.encode()) + sum(
        len(message.content.encode()) + 8 for message in request.messages
    )
    return math.ceil(size / 4) + 1 + len(request.prompt_token_ids)


def _refusal(verdict: Verdict, cost: int, limits: KeyLimits) -> ApiError:
    reason = verdict.reason or ""
    if reason == "spend":
        return BudgetExceeded(budget_message(verdict, limits), retry_after=verdict.retry_after)
    if reason == "budget":
        return QuotaExceeded(
            "You exceeded your daily token budget; it resets at 00:00 UTC.",
            retry_after=verdict.retry_after,
        )
    if reason == "too_large":
        limit = verdict.tokens.limit if verdict.tokens else 0
        return RateLimited(
            f"Request too large: it reserves {cost} tokens (prompt + max_tokens), "
            f"the limit is {limit} tokens per minute; lower max_tokens.",
            retry_after=60.0,
            kind="tokens",
        )
    kind = "tokens" if reason == "tpm" else "requests"
    return RateLimited(
        f"{_REFUSALS.get(reason, 'Rate limit reached')}; retry after "
        f"{max(1, math.ceil(verdict.retry_after))}s.",
        retry_after=verdict.retry_after,
        kind=kind,
    )


def budget_message(verdict: Verdict, limits: KeyLimits) -> str:
    """The refusal of a key over its spend budget: the budget, the spend, the reset."""
    resets = datetime.fromtimestamp(verdict.budget_resets_at, UTC)
    period = _PERIODIC[limits.budget_period]
    budget = usd_text(limits.max_budget or 0)
    return (
        f"Budget exceeded: this key spent ${usd_text(verdict.spent)} of its {period} "
        f"max_budget of ${budget}; it resets at {resets:%Y-%m-%dT%H:%M:%SZ} "
        f"(in {max(1, math.ceil(verdict.retry_after))}s)."
    )
