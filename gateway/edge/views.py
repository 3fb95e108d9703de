"""What ``/metrics`` and the console's JSON views show, from this process alone or, in a
fleet (``llmso serve --workers N``), from every worker: the worker that got the request
gathers each worker's part through the hub (``FleetLink.gather``) and merges them here,
so any worker answers for the whole host.

Each view has a *part* (what one worker holds, JSON-able) and a merge. ``serve_fleet``
registers the parts (and the admin actions) as the calls the hub may make to this
worker. Everything runs on the app's event loop.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest

from gateway.console.activity import summarize
from gateway.console.gauges import NO_ENGINE_FIGURES, window_means
from gateway.edge.admin_actions import AdminAction, apply_action
from gateway.edge.state import AppState
from gateway.fleet.link import FleetLink, Reply
from gateway.fleet.metrics import families, merged_exposition
from gateway.fleet.wire import CallFailed

log = logging.getLogger(__name__)

# How the engine figures of one model combine over workers (None: no worker has one).
_ENGINE_MERGE: dict[str, Callable[[list[float]], float]] = {
    "queue_depth": sum,
    "running": sum,
    "kv_cache_usage": max,
    "upstream_up": min,
}


async def _parts(state: AppState, op: str, local: Any, body: Any = None) -> list[Any]:
    """``local`` alone, or every worker's reply to ``op`` in a fleet."""
    if state.fleet is None:
        return [local]
    return [reply.body for reply in await _gather(state.fleet, op, body)]


async def _gather(fleet: FleetLink, op: str, body: Any = None) -> list[Reply]:
    """Every worker's reply; when the hub cannot be asked (the supervisor is gone and
    this worker drains), this worker's own part alone."""
    try:
        return await fleet.gather(op, body)
    except (ConnectionError, TimeoutError, CallFailed) as exc:
        log.warning("fleet view %r from this worker only: %s", op, type(exc).__name__)
        return [Reply(fleet.seat.worker, os.getpid(), await fleet.answer(op, body))]


# --------------------------------------------------------------------------- /metrics


async def metrics_text(state: AppState) -> bytes:
    if state.fleet is None:
        return generate_latest(state.prometheus)
    replies = await _gather(state.fleet, "metrics")
    return merged_exposition([reply.body for reply in replies])


# --------------------------------------------------------------------------- /admin/stats


def stats_part(state: AppState) -> dict[str, Any]:
    """This worker's share of ``/admin/stats``: each model's window, engine figures and
    the windowed sums behind the batch-size and overhead means."""
    console = state.console
    now = time.monotonic()
    return {
        "models": {
            status.name: {
                "window": console.activity.snapshot(status.name, now),
                "inflight": status.inflight,
            }
            for status in state.registry.list_models()
        },
        "engines": console.gauges.current(),
        "batch": console.gauges.batch.totals(now),
        "overhead": console.gauges.overhead.totals(now),
        "loop_lag_s": state.door.lag.seconds if state.door.lag is not None else None,
    }


async def stats(state: AppState) -> dict[str, Any]:
    """The ``/admin/stats`` body: per configured model, the window's figures, the engine
    gauges now, the mean batch size and gateway overhead, and the model's state; and how
    late the event loop runs (a fleet's worst worker)."""
    parts = await _parts(state, "console.stats", stats_part(state) if state.fleet is None else None)
    activity = state.console.activity
    now = time.monotonic()
    size = math.ceil(activity.window_seconds)
    batches = window_means(part["batch"] for part in parts)
    overheads = window_means(part["overhead"] for part in parts)
    models: dict[str, Any] = {}
    for status in state.registry.list_models():
        name = status.name
        mine = [part["models"][name] for part in parts if name in part["models"]]
        figures = summarize((m["window"] for m in mine), now, size)
        figures.update(_engine_row(name, parts))
        figures["batch_size_mean"] = batches.get(name)
        figures["overhead_mean_s"] = overheads.get(name)
        figures["state"] = status.state
        figures["inflight"] = sum(m["inflight"] for m in mine)
        models[name] = figures
    lags = [part["loop_lag_s"] for part in parts if part.get("loop_lag_s") is not None]
    return {
        "window_s": activity.window_seconds,
        "workers": len(parts),
        "loop_lag_s": max(lags) if lags else None,
        "models": models,
    }


def _engine_row(name: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [part["engines"][name] for part in parts if name in part["engines"]]
    if not rows:
        return {}
    merged: dict[str, Any] = {}
    for column, combine in _ENGINE_MERGE.items():
        values = [row[column] for row in rows if row.get(column) is not None]
        merged[column] = combine(values) if values else None
    return merged


# --------------------------------------------------------------------------- /admin/requests


def recent_part(state: AppState, query: dict[str, Any]) -> list[dict[str, Any]]:
    found = state.console.activity.recent(
        model=query["model"], status=query["status"], limit=query["limit"]
    )
    return [summary.to_json() for summary in found]


async def recent(
    state: AppState, model: str | None, status: str | None, limit: int
) -> list[dict[str, Any]]:
    """Newest first over every worker: each worker's newest ``limit``, merged by finish."""
    query = {"model": model, "status": status, "limit": limit}
    local = recent_part(state, query) if state.fleet is None else None
    parts = await _parts(state, "console.requests", local, query)
    merged = [row for part in parts for row in part]
    merged.sort(key=lambda row: row["finish_time"], reverse=True)
    return merged[:limit]


# --------------------------------------------------------------------------- /admin/models


def models_part(state: AppState) -> dict[str, Any]:
    return {
        "inflight": {status.name: status.inflight for status in state.registry.list_models()},
        "engines": state.console.gauges.current(),
    }


async def models_fleet(state: AppState) -> tuple[dict[str, int], dict[str, Any], list[Any]]:
    """Per model the requests in flight over every worker and the merged engine figures,
    and the workers that answered (``[{worker, pid}]``; empty outside a fleet)."""
    if state.fleet is None:
        part = models_part(state)
        return part["inflight"], part["engines"], []
    replies = await _gather(state.fleet, "models")
    inflight: Counter[str] = Counter()
    for reply in replies:
        inflight.update(reply.body["inflight"])
    parts = [reply.body for reply in replies]
    names = {name for part in parts for name in part["engines"]}
    engines = {name: {**NO_ENGINE_FIGURES, **_engine_row(name, parts)} for name in names}
    workers = [{"worker": reply.worker, "pid": reply.pid} for reply in replies]
    return dict(inflight), engines, sorted(workers, key=lambda w: w["worker"])


# --------------------------------------------------------------------------- /admin/usage


def usage_part(state: AppState) -> dict[str, Any]:
    metrics = state.admission.key_metrics
    return {
        "requests": {key: dict(tally) for key, tally in metrics.request_tally.items()},
        "tokens": {key: dict(tally) for key, tally in metrics.token_tally.items()},
    }


async def usage_tallies(state: AppState) -> dict[str, dict[str, dict[str, int]]]:
    """Per key, requests by outcome and tokens by kind, added over every worker."""
    local = usage_part(state) if state.fleet is None else None
    parts = await _parts(state, "usage", local)
    merged: dict[str, dict[str, Counter[str]]] = {"requests": {}, "tokens": {}}
    for part in parts:
        for kind, by_key in part.items():
            for key, tally in by_key.items():
                merged[kind].setdefault(key, Counter()).update(tally)
    return {kind: {k: dict(t) for k, t in by_key.items()} for kind, by_key in merged.items()}


# --------------------------------------------------------------------------- the hub's calls


def serve_fleet(link: FleetLink, state: AppState) -> None:
    """Answer the hub: this worker's parts of every view, and admin actions."""
    link.serve("metrics", lambda _: families(state.prometheus))
    link.serve("console.stats", lambda _: stats_part(state))
    link.serve("console.requests", lambda query: recent_part(state, query))
    link.serve("models", lambda _: models_part(state))
    link.serve("usage", lambda _: usage_part(state))

    async def admin(raw: list[Any]) -> None:
        await apply_action(state.registry, AdminAction.of(raw))

    link.serve("admin", admin)
