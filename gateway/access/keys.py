"""Client keys: who is calling, and which models they may use.

``KeyRing`` identifies the caller from the key it presented (the edge reads it from the
request's headers). It is immutable and built from ``auth:``; a config reload builds a new one and
swaps it in whole. It keeps only SHA-256 digests: a presented key is hashed once and
compared with EVERY stored digest by ``hmac.compare_digest`` (no early exit), so the
time taken says nothing about which key, or how much of one, matched.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from backends.base import InvalidRequest, Tenant
from config.frontdoor import PRIORITY_LIMIT, PRIORITY_RANK, AuthConfig, KeyConfig
from gateway.access.limits import KeyLimits
from gateway.errors import Unauthorized
from gateway.observe.cost import pico_of_usd
from gateway.registry import ModelNotFound
from gateway.registry.routing import CAPABILITY_PREFIX

ANONYMOUS = "anonymous"
UNAUTHENTICATED = "unauthenticated"


class Named(Protocol):
    """A model config or status: what an allow-list entry can match."""

    @property
    def name(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def capabilities(self) -> tuple[str, ...]: ...


@dataclass(frozen=True, slots=True)
class NamedAdapter:
    """A LoRA adapter as an allow-list entry sees it: its name and aliases."""

    name: str
    aliases: tuple[str, ...]
    capabilities: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Client:
    """An identified caller: its name (never the key), limits, priority (the default,
    and the range a request may ask for), fair-share weight and models."""

    name: str
    limits: KeyLimits
    priority: int = 0
    models: tuple[str, ...] | None = None
    priority_range: tuple[int, int] = (0, 0)
    weight: float = 1.0

    @property
    def tenant(self) -> Tenant:
        return Tenant(self.name, self.weight)

    def priority_of(self, asked: int | None) -> int:
        """The priority a request runs at: the key's own when it asked for none, else
        what it asked for, within the key's range (a 400 naming ``priority`` outside)."""
        if asked is None:
            return self.priority
        first, last = self.priority_range
        if not first <= asked <= last:
            allowed = f"only {first}" if first == last else f"from {first} to {last}"
            raise InvalidRequest(
                f"priority {asked} is not allowed for this key: {allowed} (lower runs first)",
                param="priority",
            )
        return asked

    @property
    def limited(self) -> bool:
        limits = self.limits
        return any(
            value is not None
            for value in (
                limits.rpm,
                limits.tpm,
                limits.max_parallel,
                limits.tokens_per_day,
                limits.max_budget,
            )
        )

    def may_use(self, model: Named) -> bool:
        if self.models is None:
            return True
        for entry in self.models:
            if entry.startswith(CAPABILITY_PREFIX):
                if entry[len(CAPABILITY_PREFIX) :] in model.capabilities:
                    return True
            elif entry == model.name or entry in model.aliases:
                return True
        return False

    def may_use_adapter(self, base: Named, adapter: NamedAdapter) -> bool:
        """An adapter is the key's when its allow-list names it, or names its base model
        (which grants all of the base's adapters)."""
        return self.may_use(base) or self.may_use(adapter)


OPEN_DOOR = Client(ANONYMOUS, KeyLimits(), priority_range=(-PRIORITY_LIMIT, PRIORITY_LIMIT))
"""The caller when no key is required: trusted, so any priority within the limit."""


class KeyRing:
    def __init__(self, auth: AuthConfig) -> None:
        self.required = auth.required
        self.names = tuple(key.name for key in auth.keys)
        self._entries = [
            (
                bytes.fromhex(key.key_sha256),
                Client(
                    key.name,
                    _limits(key),
                    PRIORITY_RANK[key.priority],
                    key.models,
                    key.allowed_priorities,
                    key.weight,
                ),
            )
            for key in auth.keys
        ]

    def clients(self) -> list[Client]:
        return [client for _, client in self._entries]

    def identify(self, presented: bytes | None) -> Client:
        """The caller who presented this key (``None``: none); raises 401 when a key is
        required and not valid."""
        if not self.required:
            return OPEN_DOOR
        if not presented:
            raise Unauthorized(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' "
                "(or 'x-api-key: <key>')."
            )
        digest = hashlib.sha256(presented).digest()
        found: Client | None = None
        for stored, client in self._entries:
            if hmac.compare_digest(digest, stored):
                found = client
        if found is None:
            raise Unauthorized("Incorrect API key provided.")
        return found


def _limits(key: KeyConfig) -> KeyLimits:
    budget = None if key.max_budget is None else pico_of_usd(key.max_budget)
    return KeyLimits(
        key.rpm, key.tpm, key.max_parallel, key.tokens_per_day, budget, key.budget_period
    )


def allowed_candidates(
    requested: str, candidates: tuple[str, ...], may_use: Callable[[str], bool] | None
) -> tuple[str, ...]:
    """The routed ``candidates`` the client key may use (``RequestRecord.may_use``);
    404 like a missing model when none. Every route that routes a model calls this."""
    if may_use is None:
        return candidates
    kept = tuple(name for name in candidates if may_use(name))
    if not kept:
        raise not_found(requested)
    return kept


def not_found(requested: str) -> ModelNotFound:
    """The same 404 the router gives a model that does not exist (no existence leak)."""
    if requested.startswith(CAPABILITY_PREFIX):
        capability = requested[len(CAPABILITY_PREFIX) :]
        return ModelNotFound(f"No model has the capability '{capability}'", param="model")
    return ModelNotFound(f"The model '{requested}' does not exist", param="model")
