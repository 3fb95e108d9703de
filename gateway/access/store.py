"""The limit store: ``open_store`` opens the one ``limits.store`` names (this process's
``MemoryStore``, or Redis shared by every replica), and ``GuardedStore`` puts it behind a
timeout and a failure policy.

Every call gets ``timeout`` seconds. A failure (an error or a timeout) marks the store
down for ``retry_interval`` seconds, during which admissions do not even try it, so a
dead store costs one timeout per interval, not one per request; the first call after the
interval tries again, and the store is back as soon as one call succeeds. While it is
down, ``on_store_error: allow`` admits without limits (``Verdict.reason == "store"``,
counted and logged) and ``deny`` refuses with 503.

Owned by the app's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from config.frontdoor import LimitsConfig
from gateway.access.errors import StoreUnavailable
from gateway.access.limits import Ask, KeyLimits, MemoryStore, Settlement, Verdict
from gateway.access.metrics import KeyMetrics

log = logging.getLogger(__name__)

UNCHECKED = Verdict(True, reason="store")
T = TypeVar("T")


class Store(Protocol):
    async def admit(self, ask: Ask) -> Verdict: ...

    async def settle(self, settlement: Settlement) -> None: ...

    async def peek(self, key: str, limits: KeyLimits) -> Verdict: ...

    async def close(self) -> None: ...


def open_store(config: LimitsConfig) -> Store:
    if config.store == "memory":
        return MemoryStore(lease_ttl=config.lease_ttl)
    from gateway.access.redis_store import RedisStore

    return RedisStore(
        config.store,
        prefix=config.prefix,
        lease_ttl=config.lease_ttl,
        timeout=config.store_timeout,
    )


class GuardedStore:
    def __init__(self, store: Store, config: LimitsConfig, metrics: KeyMetrics) -> None:
        self._store = store
        self._timeout = config.store_timeout
        self._retry_interval = config.retry_interval
        self._deny = config.on_store_error == "deny"
        self._metrics = metrics
        self._down_until = 0.0
        # "memory", "redis", or what the store calls itself (a fleet's: "fleet").
        kind = getattr(store, "kind", None)
        if not isinstance(kind, str):
            kind = "memory" if isinstance(store, MemoryStore) else "redis"
        self.kind = kind

    @property
    def up(self) -> bool:
        return self._down_until == 0.0

    async def admit(self, ask: Ask) -> Verdict:
        if self._skipping():
            return self._fallback()
        try:
            verdict = await self._bounded(self._store.admit(ask))
        except Exception as exc:
            self._failed(exc)
            return self._fallback()
        self._recovered()
        return verdict

    async def peek(self, key: str, limits: KeyLimits) -> Verdict | None:
        if self._skipping():
            return None
        try:
            verdict = await self._bounded(self._store.peek(key, limits))
        except Exception as exc:
            self._failed(exc)
            return None
        self._recovered()
        return verdict

    async def settle(self, settlement: Settlement) -> None:
        # Tried even while the store is marked down: a lost release would hold a
        # max_parallel slot until its lease expires. It runs after the response is sent.
        try:
            await self._bounded(self._store.settle(settlement))
        except Exception as exc:
            self._failed(exc)
        else:
            self._recovered()

    async def close(self) -> None:
        try:
            await self._bounded(self._store.close())
        except Exception as exc:
            log.warning("limit store: close failed: %s", type(exc).__name__)

    async def _bounded(self, call: Awaitable[T]) -> T:
        # asyncio.timeout, not wait_for: no extra task per call on the request path.
        async with asyncio.timeout(self._timeout):
            return await call

    def _skipping(self) -> bool:
        return self._down_until > 0.0 and time.monotonic() < self._down_until

    def _fallback(self) -> Verdict:
        if self._deny:
            raise StoreUnavailable(
                "the rate-limit store is unavailable", retry_after=self._retry_interval
            )
        return UNCHECKED

    def _failed(self, exc: BaseException) -> None:
        self._metrics.store_errors.inc()
        if self._down_until == 0.0:
            policy = "denying" if self._deny else "allowing unchecked"
            log.warning(
                "limit store failed (%s: %s); %s requests, retrying every %.1fs",
                type(exc).__name__,
                exc,
                policy,
                self._retry_interval,
            )
            self._metrics.store_up.set(0)
        self._down_until = time.monotonic() + self._retry_interval

    def _recovered(self) -> None:
        if self._down_until != 0.0:
            log.warning("limit store answers again; limits enforced")
            self._down_until = 0.0
            self._metrics.store_up.set(1)
