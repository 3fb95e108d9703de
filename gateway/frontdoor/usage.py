"""``GET /admin/usage``: per client key, what it used and where it stands.

``requests`` and ``tokens`` are this process's tallies since it started (per replica,
like its Prometheus counters); ``today`` and ``state`` come from the limit store, so
with Redis they are the totals over every replica.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.edge.ops import json_response, require_admin
from gateway.frontdoor.door import openai_duration
from gateway.frontdoor.keys import Client
from gateway.frontdoor.limits import Verdict, Window, seconds_to_midnight

router = APIRouter()


@router.get("/admin/usage")
async def admin_usage(request: Request) -> Response:
    state = require_admin(request, read_only=True)
    door = state.frontdoor
    metrics = door.key_metrics
    keys = []
    for client in door.keys.clients():
        verdict = await door.store.peek(client.name, client.limits) if client.limited else None
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
                "requests": dict(metrics.request_tally.get(client.name, {})),
                "tokens": dict(metrics.token_tally.get(client.name, {})),
                **_shared_state(client, verdict),
            }
        )
    return json_response(
        {
            "auth_required": door.keys.required,
            "store": {"kind": door.store.kind, "up": door.store.up},
            "keys": keys,
        }
    )


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
