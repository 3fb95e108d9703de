"""The replicas of one model, and the choice of one per attempt.

``ReplicaSet`` owns the ``Replica`` objects of one backend and its balance policy, probes
and scrapes them in the background, picks one per attempt, and applies a hot-reloaded
replica list in place (``update``). It knows nothing of the transport: the backend passes
the probe (an HTTP GET, a gRPC health call), an aiohttp session for metrics pages and,
for a model with LoRA adapters, the ``Adapters`` that list and load them (each round of
probes also reads each replica's adapters).

Ownership: everything here belongs to the event loop of the backend that built it.

A replica is eligible when it is not ejected and not draining; among those, the ones
passing health probes are preferred, and only when none does are the others tried
(probes lag behind the data path, and a single upstream must behave as it always did).
A request for an adapter narrows the eligible replicas to those that hold it, or to the
one named to load it (``Adapters.prefer``), and the policy chooses among them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any

import aiohttp

from backends.base import GenerationRequest, UpstreamUnavailable
from backends.replicas.adapters import Adapters
from backends.replicas.balance import Choice, Policy, affinity_key, build_policy
from backends.replicas.metrics import ReplicaMetrics
from backends.replicas.replica import Replica
from backends.replicas.scrape import NoMetrics, scrape_load
from config.schema import ReplicatedModel

log = logging.getLogger("llmso.route")

Endpoint = tuple[str, str | None]
"""``(url, metrics_url or None)`` of one replica."""
Probe = Callable[[Replica], Awaitable[bool]]


class ReplicaSet:
    """The replicas of one model and the policy that picks among them."""

    def __init__(
        self,
        config: ReplicatedModel,
        endpoints: Sequence[Endpoint],
        metrics: ReplicaMetrics,
        *,
        scrape_model: str | None = None,
        adapters: Adapters | None = None,
    ) -> None:
        self._metrics = metrics
        self.adapters = adapters
        self._scrape_model = scrape_model
        self.replicas: list[Replica] = []
        self._config = config
        self._policy: Policy = build_policy("round_robin", (), 1.5)
        self._probe: Probe | None = None
        self._after_probe: Callable[[], None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._probe_task: asyncio.Task[None] | None = None
        self._scrape_task: asyncio.Task[None] | None = None
        self._drains: set[asyncio.Task[None]] = set()
        self._draining: dict[str, Replica] = {}
        """Removed replicas with requests still in flight, by URL."""
        self.update(config, endpoints)

    @property
    def up(self) -> bool:
        return any(replica.health.up for replica in self.replicas)

    @property
    def balance(self) -> str:
        return self._policy.name

    def candidates(self, exclude: Collection[str], now: float) -> list[Replica]:
        """Replicas a new attempt may use: not ejected, not in ``exclude`` (URLs), healthy
        ones first (see the module doc)."""
        open_ = [r for r in self.replicas if r.url not in exclude and not r.ejected(now)]
        return [r for r in open_ if r.health.up] or open_

    def unavailable(self, now: float) -> UpstreamUnavailable:
        waits = [r.breaker.check(now).retry_after for r in self.replicas]
        return UpstreamUnavailable(
            f"every upstream replica of {self._config.name!r} is failing; circuit open",
            retry_after=max(min(waits, default=1.0), 0.1),
        )

    def pick(
        self, request: GenerationRequest | None, exclude: Collection[str], attempt: int
    ) -> Replica:
        """The replica for one attempt, already counted as in flight (``release`` it).
        ``request`` is ``None`` for calls without a prompt to key on (embeddings).
        Raises ``UpstreamUnavailable`` when every replica is ejected."""
        now = time.monotonic()
        eligible = self.candidates(exclude, now) or self.candidates((), now)
        if not eligible:
            raise self.unavailable(now)
        preferred = self._prefer(request, eligible)
        choice = self._choose(request, preferred or eligible)
        reason = "retry" if attempt else "adapter" if preferred else choice.reason
        replicas = self.replicas
        replica = replicas[choice.index]
        replica.acquire(self._policy.name, reason)
        if len(replicas) > 1:
            log.info(
                "route request=%s model=%s replica=%s balance=%s reason=%s inflight=%d",
                request.request_id if request else "-", self._config.name, replica.url,
                self._policy.name,
                reason, replica.inflight,
            )  # fmt: skip
        return replica

    def _prefer(
        self, request: GenerationRequest | None, eligible: list[Replica]
    ) -> list[Replica] | None:
        adapter = request.adapter if request is not None else None
        if adapter is None or self.adapters is None:
            return None
        return self.adapters.prefer(adapter, eligible)

    def _choose(self, request: GenerationRequest | None, eligible: list[Replica]) -> Choice:
        replicas = self.replicas
        if len(eligible) == 1:
            return Choice(replicas.index(eligible[0]), "only")
        key = (
            affinity_key(request, self._config.prefix_chars)
            if self._policy.name == "prefix" and request is not None
            else ""
        )
        positions = [replicas.index(r) for r in eligible]
        return self._policy.choose(
            positions, [r.inflight for r in replicas], [r.score() for r in replicas], key
        )

    def snapshot(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [replica.snapshot(now) for replica in self.replicas]

    # ------------------------------------------------------------------ hot reload

    def update(self, config: ReplicatedModel, endpoints: Sequence[Endpoint]) -> list[Replica]:
        """Move onto a new replica list and balance settings, in place: replicas kept by
        URL keep their health, breaker and counts; new ones join (probed at once when
        the set runs); removed ones drain (no new requests, those in flight finish,
        then their metric children go). Returns the removed replicas."""
        old = {replica.url: replica for replica in self.replicas}
        kept: list[Replica] = []
        joined: list[Replica] = []
        for url, metrics_url in endpoints:
            # A URL removed earlier and still draining comes back as the same replica
            # (its metric children are the ones the drain would otherwise remove).
            replica = old.pop(url, None) or self._draining.pop(url, None)
            if replica is None:
                replica = Replica(url, metrics_url, config, self._metrics)
                joined.append(replica)
            else:
                if metrics_url != replica.metrics_url:  # a new page: ask it again
                    replica.metrics_url = metrics_url
                    replica.has_metrics = metrics_url is not None
                replica.draining = False
            kept.append(replica)
        self._config = config
        self.replicas = kept
        urls = [replica.url for replica in kept]
        self._policy = build_policy(config.balance, urls, config.prefix_load_factor)
        removed = list(old.values())
        now = time.monotonic()
        for replica in removed:
            replica.draining = True
            replica.refresh_up(now)
            if replica.inflight == 0:
                replica.forget_metrics()
            else:  # in flight means a running loop: forget once the last one ends
                self._draining[replica.url] = replica
                self._background(self._forget(replica), f"llmso-drain-{replica.url}")
        if self._running():
            self._restart_scrape()
            self._kick_probe(joined)
        return removed

    async def _forget(self, replica: Replica) -> None:
        await replica.drained()
        if replica.draining:  # not listed again meanwhile
            self._draining.pop(replica.url, None)
            replica.forget_metrics()

    # ------------------------------------------------------------------ background

    def start(
        self,
        probe: Probe,
        session: aiohttp.ClientSession,
        after_probe: Callable[[], None] | None = None,
    ) -> None:
        """Run the periodic probes and metrics scrapes (call after a first ``probe_all``)."""
        self._probe, self._session, self._after_probe = probe, session, after_probe
        name = self._config.name
        self._probe_task = asyncio.create_task(self._probe_forever(), name=f"llmso-health-{name}")
        self._restart_scrape()

    async def stop(self) -> None:
        tasks = [self._probe_task, self._scrape_task, *self._drains]
        self._probe_task = self._scrape_task = None
        self._probe = None
        for task in tasks:
            await cancel(task)
        if self.adapters is not None:
            await self.adapters.stop()

    def _running(self) -> bool:
        return self._probe_task is not None

    async def probe_all(self, probe: Probe | None = None) -> bool:
        """Probe every replica once; returns whether any passed this time."""
        probe = probe or self._probe
        if probe is None:
            return False
        replicas = list(self.replicas)
        results, _ = await asyncio.gather(
            asyncio.gather(*(probe(r) for r in replicas)), self._list_adapters(replicas)
        )
        now = time.monotonic()
        for replica, ok in zip(replicas, results, strict=True):
            replica.record_probe(ok, now)
        if self._after_probe is not None:
            self._after_probe()
        return any(results)

    async def _list_adapters(self, replicas: list[Replica]) -> None:
        if self.adapters is not None:
            await self.adapters.refresh(replicas)

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self._config.health_interval)
            await self.probe_all()

    def _kick_probe(self, replicas: list[Replica]) -> None:
        """Probe newly added replicas now instead of a health interval later."""
        probe = self._probe
        if probe is None or not replicas:
            return

        async def once() -> None:
            results, _ = await asyncio.gather(
                asyncio.gather(*(probe(r) for r in replicas)), self._list_adapters(replicas)
            )
            now = time.monotonic()
            for replica, ok in zip(replicas, results, strict=True):
                replica.record_probe(ok, now)

        self._background(once(), f"llmso-probe-new-{self._config.name}")

    def _background(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._drains.add(task)
        task.add_done_callback(self._drains.discard)

    def _restart_scrape(self) -> None:
        if self._scrape_task is not None:
            self._scrape_task.cancel()
            self._scrape_task = None
        if self._config.metrics_scrape_interval > 0 and self._session is not None:
            self._scrape_task = asyncio.create_task(
                self._scrape_forever(self._session), name=f"llmso-scrape-{self._config.name}"
            )

    async def _scrape_forever(self, session: aiohttp.ClientSession) -> None:
        interval = self._config.metrics_scrape_interval
        seconds = min(self._config.connect_timeout, max(interval, 0.25))
        while True:
            targets = [r for r in self.replicas if r.has_metrics]
            if not targets:
                return
            await asyncio.gather(*(self._scrape(session, r, seconds) for r in targets))
            await asyncio.sleep(interval)

    async def _scrape(
        self, session: aiohttp.ClientSession, replica: Replica, seconds: float
    ) -> None:
        url = replica.metrics_url
        if url is None:
            return
        try:
            replica.record_load(await scrape_load(session, url, seconds, self._scrape_model))
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
