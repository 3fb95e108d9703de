"""What each client key used and where it stands: the body of ``GET /admin/usage``.

``requests`` and ``tokens`` are tallies since start: this process's (per replica, like
its Prometheus counters), or the ones the caller passes (a fleet's workers' added up);
``today`` and ``state`` come from the limit store, so with Redis (or a fleet's own
store) they are the totals over every replica.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.access.admission import Admission
from gateway.access.keys import Client
from gateway.access.limits import Verdict, Window, openai_duration, seconds_to_midnight

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
                },
                "requests": dict(requests.get(client.name, {})),
                "tokens": dict(tokens.get(client.name, {})),
                **_shared_state(client, verdict),
            }
        )
    return {
        "auth_required": admission.keys.required,
        "store": {"kind": admission.store.kind, "up": admission.store.up},
        "keys": keys,
    }


def _shared_state(client: Client, verdict: Verdict | None) -> dict[str, Any]:
    if verdict is None:
        return {"today": None, "state": None}
    budget = client.limits.tokens_per_day
    return {
        "today": {
            "tokens_used": verdict.day_used,
            "budget_left": None if budget is None else max(0, budget - verdict.day_used),
            "resets_in": openai_duration(seconds_to_midnight(time.time())),
        },
        "state": {
            "requests": _window(verdict.requests),
            "tokens": _window(verdict.tokens),
            "inflight": verdict.inflight,
        },
    }


def _window(window: Window | None) -> dict[str, Any] | None:
    if window is None:
        return None
    return {
        "limit": window.limit,
        "remaining": window.remaining,
        "reset": openai_duration(window.reset),
    }
