"""What the gateway knows about one upstream replica, independent of its transport.

``Replica`` holds probe hysteresis (``HealthTracker``), outlier ejection (a
``CircuitBreaker`` fed by real requests: ``breaker_failures`` consecutive 5xx/timeouts/
connection failures eject it for ``breaker_cooldown`` seconds, after which requests may
try it again), this gateway's in-flight count, the engine's own gauges read from its
metrics page, the LoRA adapters it holds (``adapters``: listed by the engine, or loaded
by this gateway; see ``backends.replicas.adapters``), and whether a hot reload took it
out of the config (``draining``: no new requests; those in flight finish).

Ownership: the event loop of the backend whose ``ReplicaSet`` built it. The transport
(an HTTP session, a gRPC channel) stays with that backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from backends.base import BackendError, Overloaded, UpstreamRejected
from backends.replicas.health import CircuitBreaker, HealthTracker
from backends.replicas.metrics import ReplicaMetrics
from backends.replicas.scrape import EngineLoad
from config.schema import ReplicatedModel

log = logging.getLogger("llmso.route")

# A full KV cache is about as bad as one more queued request: the next one waits either way.
_KV_WEIGHT = 1.0


class Replica:
    """One upstream address. See the module doc."""

    def __init__(
        self, url: str, metrics_url: str | None, config: ReplicatedModel, metrics: ReplicaMetrics
    ) -> None:
        self.url = url
        self.metrics_url = metrics_url
        self.health = HealthTracker(config.health_failures_down, config.health_successes_up)
        self.breaker = CircuitBreaker(config.breaker_failures, config.breaker_cooldown)
        self.inflight = 0
        self.load = EngineLoad()
        self.has_metrics = metrics_url is not None
        self.draining = False
        self.adapters: frozenset[str] = frozenset()
        """The LoRA adapters this replica serves, as last listed or loaded."""
        self._adapter_epoch = 0  # bumped by every change the gateway makes itself
        self._idle = asyncio.Event()
        self._idle.set()
        self._metrics = metrics
        self._labels = (config.name, url)
        labels = self._labels
        self._inflight_gauge = metrics.inflight.labels(*labels)
        self._up_gauge = metrics.up.labels(*labels)
        self._waiting_gauge = metrics.waiting.labels(*labels)
        self._running_gauge = metrics.running.labels(*labels)
        self._kv_gauge = metrics.kv_usage.labels(*labels)
        self._ejections = metrics.ejections.labels(*labels)
        # Children resolved once per label value: labels() costs a lock and a lookup.
        self._children: dict[tuple[str, ...], Any] = {}
        self._up_value: int | None = None  # what _up_gauge says

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
        self._idle.clear()
        self._inflight_gauge.set(self.inflight)
        self._child(self._metrics.routes, balance, reason).inc()

    def release(self) -> None:
        self.inflight -= 1
        self._inflight_gauge.set(self.inflight)
        if self.inflight == 0:
            self._idle.set()

    async def drained(self) -> None:
        """Return once no request is in flight here (see ``ReplicaSet.update``)."""
        await self._idle.wait()

    def account(self, error: BackendError | None, now: float) -> None:
        """One attempt's outcome. A 4xx proves the replica works; a 429 says nothing
        either way; everything else counts towards ejection."""
        self._child(self._metrics.requests, _outcome(error)).inc()
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

    @property
    def adapter_epoch(self) -> int:
        return self._adapter_epoch

    def hold_adapter(self, name: str) -> None:
        """This gateway loaded ``name`` here."""
        self.adapters |= {name}
        self._adapter_epoch += 1

    def drop_adapter(self, name: str) -> None:
        """This gateway unloaded ``name`` here."""
        self.adapters -= {name}
        self._adapter_epoch += 1

    def record_adapters(self, listed: frozenset[str], epoch: int) -> None:
        """The engine's own list, read while the epoch was ``epoch``. A list read before
        a load or unload of ours finished may predate it, so it is dropped; the next
        read tells."""
        if epoch == self._adapter_epoch:
            self.adapters = listed

    def count_adapter_load(self, error: BackendError | None) -> None:
        self._child(self._metrics.adapter_loads, _outcome(error)).inc()

    def refresh_up(self, now: float) -> None:
        # Called after every attempt: the gauge is written only when it changes.
        up = 1 if self.health.up and not self.ejected(now) and not self.draining else 0
        if up != self._up_value:
            self._up_value = up
            self._up_gauge.set(up)

    def snapshot(self, now: float) -> dict[str, object]:
        """What the admin API shows for this replica."""
        return {
            "url": self.url,
            "up": self.health.up,
            "ejected": self.ejected(now),
            "draining": self.draining,
            "inflight": self.inflight,
            "queue_depth": self.load.waiting,
            "running": self.load.running,
            "kv_cache_usage": self.load.kv_usage,
            "adapters": sorted(self.adapters),
        }

    def forget_metrics(self) -> None:
        """Drop this replica's labelled children (it left the config and drained), so
        the ``replica`` label stays bounded by the current config."""
        metrics = self._metrics
        gauges: tuple[Any, ...] = (metrics.inflight, metrics.up, metrics.waiting, metrics.running)
        for family in (*gauges, metrics.kv_usage, metrics.ejections):
            _remove(family, self._labels)
        labelled = {
            str(id(f)): f for f in (metrics.requests, metrics.routes, metrics.adapter_loads)
        }
        for key in self._children:
            _remove(labelled[key[0]], (*self._labels, *key[1:]))
        self._children.clear()

    def _child(self, family: Any, *values: str) -> Any:
        key = (str(id(family)), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*self._labels, *values)
        return child


def _remove(family: Any, labels: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set
        family.remove(*labels)


def _outcome(error: BackendError | None) -> str:
    """A bounded label: the error class's own code, never one an upstream sent."""
    if error is None:
        return "ok"
    if isinstance(error, UpstreamRejected):
        return "rejected"
    return type(error).code or "error"
