"""Per-key Prometheus families and this process's usage tallies for ``/admin/usage``.

Labels are bounded: ``key`` is a configured key name, ``anonymous`` (auth off) or
``unauthenticated`` (no valid key); ``status`` is the request outcome; ``type`` is
``prompt`` or ``completion``; ``model`` a configured model. Owned by one app, used on its
event loop only.
"""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any

from prometheus_client import CollectorRegistry

from backends.metric_types import LoopCounter, LoopGauge
from gateway.observe.cost import usd


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = LoopCounter(
            "llmso_key_requests_total",
            "Requests on generation routes by client key and outcome.",
            ("key", "status"),
            registry=registry,
        )
        self.tokens = LoopCounter(
            "llmso_key_tokens_total",
            "Tokens by client key: prompt or completion.",
            ("key", "type"),
            registry=registry,
        )
        self.spend = LoopCounter(
            "llmso_spend_total",
            "USD charged for answers, at the models' pricing, by model and client key.",
            ("model", "key"),
            registry=registry,
        )
        self.store_errors = LoopCounter(
            "llmso_limit_store_errors_total",
            "Limit store calls that failed or timed out.",
            registry=registry,
        )
        self.store_up = LoopGauge(
            "llmso_limit_store_up",
            "1 while the limit store answers, 0 after a failure until it answers again.",
            registry=registry,
        )
        self.store_up.set(1)
        self.request_tally: dict[str, Tally[str]] = {}
        self.token_tally: dict[str, Tally[str]] = {}
        self.spend_tally: dict[str, Tally[str]] = {}  # key -> model -> picodollars
        self._children: dict[tuple[int, str, str], Any] = {}  # labels() once per series

    def _child(self, family: LoopCounter, key: str, value: str) -> Any:
        series = (id(family), key, value)
        found = self._children.get(series)
        if found is None:
            found = self._children[series] = family.labels(key, value)
        return found

    def observe(self, key: str, status: str, prompt: int, completion: int) -> None:
        self._child(self.requests, key, status).inc()
        _tally(self.request_tally, key)[status] += 1
        if prompt or completion:
            self._child(self.tokens, key, "prompt").inc(prompt)
            self._child(self.tokens, key, "completion").inc(completion)
            tokens = _tally(self.token_tally, key)
            tokens["prompt"] += prompt
            tokens["completion"] += completion

    def charge(self, key: str, model: str, cost: int) -> None:
        """Count ``cost`` picodollars spent by ``key`` on ``model``."""
        self._child(self.spend, model, key).inc(usd(cost))
        _tally(self.spend_tally, key)[model] += cost


def _tally(tallies: dict[str, Tally[str]], key: str) -> Tally[str]:
    """``tallies[key]``, created on first use (not a new ``Counter`` per call, as
    ``setdefault`` would build)."""
    found = tallies.get(key)
    if found is None:
        found = tallies[key] = Tally()
    return found
