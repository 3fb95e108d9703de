"""The upstream replicas of one model: health, ejection, load, and the choice of one.

``Replica`` holds what the gateway knows about one base URL: probe hysteresis
(``HealthTracker``), outlier ejection (a ``CircuitBreaker`` fed by real requests:
``breaker_failures`` consecutive 5xx/timeouts/connection failures eject it for
``breaker_cooldown`` seconds, after which requests may try it again), this gateway's
in-flight count, and the engine's own gauges read from its ``/metrics``. ``ReplicaSet``
owns the replicas of one backend and its balance policy, probes and scrapes them
in the background, and picks one per attempt.

Ownership: everything here belongs to the event loop of the backend that built it. All
replicas share the backend's one pooled aiohttp session; its connector keeps a separate
keep-alive pool per host, which is the per-replica client state.

A replica is eligible when it is not ejected; among those, the ones passing health
probes are preferred, and only when none does are the others tried (probes lag behind
the data path, and a single upstream must behave as it always did).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from backends.base import (
    BackendError,
    GenerationRequest,
    Overloaded,
    UpstreamRejected,
    UpstreamUnavailable,
)
from backends.openai_proxy.balance import Choice, affinity_key, build_policy
from backends.openai_proxy.engines import split_base_url
from backends.openai_proxy.health import CircuitBreaker, HealthTracker
from backends.openai_proxy.scrape import EngineLoad, NoMetrics, scrape_load
from backends.replica_metrics import ReplicaMetrics
from config.schema import OpenAIModelConfig

log = logging.getLogger("llmso.route")

# A full KV cache is about as bad as one more queued request: the next one waits either way.
_KV_WEIGHT = 1.0


class Replica:
    """One upstream base URL. See the module doc."""

    def __init__(
        self, index: int, url: str, config: OpenAIModelConfig, metrics: ReplicaMetrics
    ) -> None:
        self.index = index
        self.url = url
        self.root, self.api = split_base_url(url)
        self.health = HealthTracker(config.health_failures_down, config.health_successes_up)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown)
        self.inflight = 0
        self.load = EngineLoad()
        self.has_metrics = True
        labels = (config.name, url)
        self._inflight_gauge = metrics.inflight.labels(*labels)
        self._up_gauge = metrics.up.labels(*labels)
        self._waiting_gauge = metrics.waiting.labels(*labels)
        self._running_gauge = metrics.running.labels(*labels)
        self._kv_gauge = metrics.kv_usage.labels(*labels)
        self._ejections = metrics.ejections.labels(*labels)
        self._requests = metrics.requests
        self._routes = metrics.routes
        self._labels = labels
        # Children resolved once per label value: labels() costs a lock and a lookup.
        self._children: dict[tuple[str, ...], Any] = {}

    def score(self) -> float:
        """Load estimate for ``least_loaded``. The engine's counts include this gateway's
        requests (max, not sum) but also other gateways'; the scrape is up to an interval
        old, so our own live count is the floor. Queued requests count twice: they are
        what a new request would wait behind."""
        load = self.load
        busy = max(float(self.inflight), load.running + load.waiting)
        return busy + load.waiting + _KV_WEIGHT * load.kv_usage

    def ejected(self, now: float) -> bool:
        return not self.breaker.check(now).allowed

    def acquire(self, balance: str, reason: str) -> None:
        self.inflight += 1
        self._inflight_gauge.set(self.inflight)
        self._child(self._routes, balance, reason).inc()

    def release(self) -> None:
        self.inflight -= 1
        self._inflight_gauge.set(self.inflight)

    def account(self, error: BackendError | None, now: float) -> None:
        """One attempt's outcome. A 4xx proves the replica works; a 429 says nothing
        either way; everything else counts towards ejection."""
        self._child(self._requests, _outcome(error)).inc()
        if error is None or isinstance(error, UpstreamRejected):
            self.breaker.record_success()
        elif not isinstance(error, Overloaded):
            was_open = self.breaker.is_open
            self.breaker.record_failure(now)
            if self.breaker.is_open and not was_open:
                self._ejections.inc()
                log.warning("replica %s of %s ejected: %s", self.url, self._labels[0], error)
        self.refresh_up(now)

    def record_probe(self, ok: bool, now: float) -> None:
        self.health.record(ok)
        self.refresh_up(now)

    def record_load(self, load: EngineLoad) -> None:
        self.load = load
        self._waiting_gauge.set(load.waiting)
        self._running_gauge.set(load.running)
        self._kv_gauge.set(load.kv_usage)

    def _child(self, family: Any, *values: str) -> Any:
        key = (str(id(family)), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*self._labels, *values)
        return child

    def refresh_up(self, now: float) -> None:
        self._up_gauge.set(1 if self.health.up and not self.ejected(now) else 0)


def _outcome(error: BackendError | None) -> str:
    """A bounded label: the error class's own code, never one an upstream sent."""
    if error is None:
        return "ok"
    if isinstance(error, UpstreamRejected):
        return "rejected"
    return type(error).code or "error"


class ReplicaSet:
    """The replicas of one model and the policy that picks among them."""

    def __init__(self, config: OpenAIModelConfig, metrics: ReplicaMetrics) -> None:
        self._config = config
        urls = config.upstream_urls
        self.replicas = [Replica(i, url, config, metrics) for i, url in enumerate(urls)]
        self._policy = build_policy(config.balance, urls, config.prefix_load_factor)
        self._log_routes = len(urls) > 1

    @property
    def up(self) -> bool:
        return any(replica.health.up for replica in self.replicas)

    def candidates(self, exclude: Sequence[int], now: float) -> list[int]:
        """Replicas a new attempt may use: not ejected, not in ``exclude``, healthy
        ones first (see the module doc)."""
        open_ = [r for r in self.replicas if r.index not in exclude and not r.ejected(now)]
        healthy = [r.index for r in open_ if r.health.up]
        return healthy or [r.index for r in open_]

    def unavailable(self, now: float) -> UpstreamUnavailable:
        waits = [r.breaker.check(now).retry_after for r in self.replicas]
        return UpstreamUnavailable(
            f"every upstream replica of {self._config.name!r} is failing; circuit open",
            retry_after=max(min(waits, default=1.0), 0.1),
        )

    def pick(
        self, request: GenerationRequest | None, exclude: Sequence[int], attempt: int
    ) -> Replica:
        """The replica for one attempt, already counted as in flight (``release`` it).
        ``request`` is ``None`` for calls without a prompt to key on (embeddings).
        Raises ``UpstreamUnavailable`` when every replica is ejected."""
        now = time.monotonic()
        eligible = self.candidates(exclude, now) or self.candidates((), now)
        if not eligible:
            raise self.unavailable(now)
        replicas = self.replicas
        if len(eligible) == 1:
            choice = Choice(eligible[0], "only")
        else:
            key = (
                affinity_key(request, self._config.prefix_chars)
                if self._policy.name == "prefix" and request is not None
                else ""
            )
            choice = self._policy.choose(
                eligible, [r.inflight for r in replicas], [r.score() for r in replicas], key
            )
        reason = "retry" if attempt else choice.reason
        replica = replicas[choice.index]
        replica.acquire(self._policy.name, reason)
        if self._log_routes:
            log.info(
                "route request=%s model=%s replica=%s balance=%s reason=%s inflight=%d",
                request.request_id if request else "-", self._config.name, replica.url,
                self._policy.name,
                reason, replica.inflight,
            )  # fmt: skip
        return replica

    # ------------------------------------------------------------------ background

    async def probe_all(self, probe: Callable[[Replica], Awaitable[bool]]) -> None:
        results = await asyncio.gather(*(probe(r) for r in self.replicas))
        now = time.monotonic()
        for replica, ok in zip(self.replicas, results, strict=True):
            replica.record_probe(ok, now)

    async def scrape_forever(self, session: aiohttp.ClientSession) -> None:
        interval = self._config.metrics_scrape_interval
        seconds = min(self._config.connect_timeout, max(interval, 0.25))
        while True:
            targets = [r for r in self.replicas if r.has_metrics]
            if not targets:
                return
            await asyncio.gather(*(self._scrape(session, r, seconds) for r in targets))
            await asyncio.sleep(interval)

    @staticmethod
    async def _scrape(session: aiohttp.ClientSession, replica: Replica, seconds: float) -> None:
        try:
            replica.record_load(await scrape_load(session, replica.root + "/metrics", seconds))
        except NoMetrics:
            replica.has_metrics = False  # llama.cpp's server has none: stop asking
        except (aiohttp.ClientError, TimeoutError, OSError, UnicodeError):
            pass  # keep the last reading; health probes decide whether it is down


async def cancel(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task and wait for it to end."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
