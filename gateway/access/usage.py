"""What each client key used and where it stands: the body of ``GET /admin/usage``.

``requests`` and ``tokens`` are tallies since start: this process's (per replica, like
its Prometheus counters), or the ones the caller passes (a fleet's workers' added up);
``spend`` (USD, per model) is this process's since it started (with ``workers > 1``, the
worker that answered: the budget below is the fleet's); ``today``, ``budget`` and
``state`` come from the limit store, so with Redis (or a fleet's own store) they are the
totals over every replica. ``spend_by_model`` sums this process's spend over every key.
"""

from __future__ import annotations

import math
import time
from collections import Counter as Tally
from datetime import UTC, datetime
from typing import Any

from gateway.access.admission import Admission
from gateway.access.keys import Client
from gateway.access.limits import (
    KeyLimits,
    Verdict,
    Window,
    openai_duration,
    seconds_to_midnight,
)
from gateway.observe.cost import usd

Tallies = dict[str, dict[str, dict[str, int]]]
"""``{"requests": {key: {status: n}}, "tokens": {key: {type: n}}}``."""


async def usage_report(admission: Admission, tallies: Tallies | None = None) -> dict[str, Any]:
    metrics = admission.key_metrics
    requests = metrics.request_tally if tallies is None else tallies["requests"]
    tokens = metrics.token_tally if tallies is None else tallies["tokens"]
    keys = []
    for client in admission.keys.clients():
        limited = client.limited
        verdict = await admission.store.peek(client.name, client.limits) if limited else None
        keys.append(
            {
                "name": client.name,
                "priority": client.priority,
                "models": list(client.models) if client.models is not None else None,
                "limits": {
                    "rpm": client.limits.rpm,
                    "tpm": client.limits.tpm,
                    "max_parallel": client.limits.max_parallel,
                    "tokens_per_day": client.limits.tokens_per_day,
                    "max_budget": _usd_or_none(client.limits.max_budget),
                    "budget_period": client.limits.budget_period,
                },
                "requests": dict(requests.get(client.name, {})),
                "tokens": dict(tokens.get(client.name, {})),
                "spend": _spend(metrics.spend_tally.get(client.name, Tally())),
                **_shared_state(client, verdict),
            }
        )
    by_model: Tally[str] = Tally()
    for spent in metrics.spend_tally.values():
        by_model.update(spent)
    return {
        "auth_required": admission.keys.required,
        "store": {"kind": admission.store.kind, "up": admission.store.up},
        "keys": keys,
        "spend_by_model": {model: usd(pico) for model, pico in sorted(by_model.items())},
    }


def _spend(by_model: Tally[str]) -> dict[str, Any]:
    return {
        "usd": usd(sum(by_model.values())),
        "by_model": {model: usd(pico) for model, pico in sorted(by_model.items())},
    }


def _usd_or_none(pico: int | None) -> float | None:
    return None if pico is None else usd(pico)


def _shared_state(client: Client, verdict: Verdict | None) -> dict[str, Any]:
    if verdict is None:
        return {"today": None, "budget": None, "state": None}
    budget = client.limits.tokens_per_day
    return {
        "today": {
            "tokens_used": verdict.day_used,
            "budget_left": None if budget is None else max(0, budget - verdict.day_used),
            "resets_in": openai_duration(seconds_to_midnight(time.time())),
        },
        "budget": _budget(client.limits, verdict),
        "state": {
            "requests": _window(verdict.requests),
            "tokens": _window(verdict.tokens),
            "inflight": verdict.inflight,
        },
    }


def _budget(limits: KeyLimits, verdict: Verdict) -> dict[str, Any] | None:
    """The spend budget of the current period, over every replica (the store's)."""
    if limits.max_budget is None:
        return None
    resets_at = verdict.budget_resets_at
    return {
        "max_budget": usd(limits.max_budget),
        "period": limits.budget_period,
        "spent": usd(verdict.spent),
        "left": usd(max(0, limits.max_budget - verdict.spent)),
        "resets_at": datetime.fromtimestamp(resets_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "resets_in_s": max(0, math.ceil(resets_at - time.time())),
    }


def _window(window: Window | None) -> dict[str, Any] | None:
    if window is None:
        return None
    return {
        "limit": window.limit,
        "remaining": window.remaining,
        "reset": openai_duration(window.reset),
    }
