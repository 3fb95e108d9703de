"""Operational and catalogue routes: health, readiness, metrics, models, admin (models,
per-key usage). In a fleet, ``/metrics`` and the admin views answer for every worker
(``gateway.edge.views``) and admin mutations reach every worker
(``gateway.edge.admin_actions``)."""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from gateway.access.keys import Client, NamedAdapter
from gateway.access.usage import usage_report
from gateway.console.gauges import NO_ENGINE_FIGURES
from gateway.edge import views
from gateway.edge.admin_actions import AdminAction, Applied, run_admin
from gateway.edge.state import AppState
from gateway.errors import RouteNotFound, Unauthorized
from gateway.registry import ModelNotFound, ModelStatus

router = APIRouter()


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.llmso
    return state


@router.get("/health")
async def health() -> Response:
    return json_response({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    state = _state(request)
    registry = state.registry
    models = {status.name: status.state for status in registry.list_models()}
    draining = state.drain.draining  # SIGTERM: leave the load balancer (gateway.edge.drain)
    if registry.is_ready() and not draining:
        return json_response({"status": "ready", "models": models})
    status = "draining" if draining else "not_ready"
    response = json_response({"status": status, "models": models}, status=503)
    response.headers["Retry-After"] = "1"
    return response


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(await views.metrics_text(_state(request)), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    state = _state(request)
    client = state.door.identify(request.scope)  # only the key's models
    return json_response({"object": "list", "data": _cards(state, client)})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> Response:
    state = _state(request)
    client = state.door.identify(request.scope)
    for card in _cards(state, client):
        if model_id == card["id"] or model_id in card["llmso"]["aliases"]:
            return json_response(card)
    raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")


def _cards(state: AppState, client: Client) -> list[dict[str, Any]]:
    """Every card the key may see: models and their adapters, then split routes."""
    cards = [
        card
        for status in state.registry.list_models()
        for card in _visible_cards(status, state.started_at, client)
    ]
    return cards + _route_cards(state, client, {card["id"] for card in cards})


def _route_cards(state: AppState, client: Client, visible: set[str]) -> list[dict[str, Any]]:
    """A card per split route the key may call: its allow-list names the route, or it may
    use one of the targets (the route then picks among those)."""
    registry = state.registry
    return [
        {
            "id": route.name,
            "object": "model",
            "created": state.started_at,
            "owned_by": "llmso",
            "llmso": {
                "aliases": [],
                "capabilities": [],
                "split": dict(route.split),
                "sticky": route.sticky,
            },
        }
        for route in registry.splits.all()
        if (client.models is not None and route.name in client.models)
        or any(target in visible for target in registry.splits.targets(route.name))
    ]


def _model_card(status: ModelStatus, started_at: int) -> dict[str, Any]:
    return {
        "id": status.name,
        "object": "model",
        "created": int(status.loaded_at or started_at),
        "owned_by": status.owned_by,
        "llmso": {
            "backend": status.backend,
            "state": status.state,
            "aliases": list(status.aliases),
            "capabilities": list(status.capabilities),
        },
    }


def _visible_cards(status: ModelStatus, started_at: int, client: Client) -> list[dict[str, Any]]:
    """The cards of ``status`` the key may see: the model's, and a card per LoRA adapter
    it may use (its own name, ``parent`` the base model, as vLLM lists them)."""
    base = _model_card(status, started_at)
    cards = [base] if client.may_use(status) else []
    for name, aliases in status.adapters:
        if client.may_use_adapter(status, NamedAdapter(name, aliases)):
            llmso = {**base["llmso"], "aliases": list(aliases), "adapter_of": status.name}
            cards.append(
                {**base, "id": name, "parent": status.name, "root": status.name, "llmso": llmso}
            )
    return cards


# --------------------------------------------------------------------------- admin


def require_admin(request: Request, *, read_only: bool = False) -> AppState:
    """The app state once the caller may use this admin route. Without an admin key,
    read-only views are open while client auth is off, and mutations do not exist."""
    state = _state(request)
    if not state.admin_key:
        if read_only and not state.config.auth.required:
            return state
        raise RouteNotFound(f"no route for {request.method} {request.url.path}")
    supplied = request.headers.get("authorization", "")
    expected = f"Bearer {state.admin_key}"
    if not hmac.compare_digest(supplied.encode(), expected.encode()):
        raise Unauthorized("missing or wrong admin bearer token")
    return state


def status_dict(status: ModelStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "backend": status.backend,
        "state": status.state,
        "aliases": list(status.aliases),
        "capabilities": list(status.capabilities),
        "pid": status.pid,
        "memory_bytes": status.memory_bytes,
        "inflight": status.inflight,
        "loaded_at": status.loaded_at,
        "last_used": status.last_used,
        "last_error": status.last_error,
        "priority": status.priority,
        "max_context": status.max_context,
        "restarts": status.restarts,
        "retry_in": status.retry_in,
        "replicas": list(status.replicas),
        "adapters": [{"name": name, "aliases": list(aliases)} for name, aliases in status.adapters],
    }


@router.get("/admin/models")
async def admin_models(request: Request) -> Response:
    state = require_admin(request, read_only=True)
    inflight, engines, workers = await views.models_fleet(state)
    models = [
        {
            **status_dict(status),
            **engines.get(status.name, NO_ENGINE_FIGURES),
            "inflight": inflight.get(status.name, status.inflight),
        }
        for status in state.registry.list_models()
    ]
    body: dict[str, Any] = {"models": models, "mutations": bool(state.admin_key)}
    if workers:
        body["workers"] = workers
    return json_response(body)


def applied_response(applied: Applied) -> Response:
    """An admin mutation's answer: the model's status here, and in a fleet the workers
    that failed to follow (``fleet_failures``)."""
    body = status_dict(applied.status)
    if applied.failures:
        body["fleet_failures"] = list(applied.failures)
    return json_response(body)


@router.post("/admin/models/{name}/load")
async def admin_load(name: str, request: Request) -> Response:
    state = require_admin(request)
    return applied_response(await run_admin(state, AdminAction("load", name)))


@router.post("/admin/models/{name}/unload")
async def admin_unload(name: str, request: Request) -> Response:
    state = require_admin(request)
    return applied_response(await run_admin(state, AdminAction("unload", name)))


@router.post("/admin/models/{name}/drain")
async def admin_drain(name: str, request: Request) -> Response:
    state = require_admin(request)
    return applied_response(await run_admin(state, AdminAction("drain", name)))


@router.get("/admin/usage")
async def admin_usage(request: Request) -> Response:
    """Per client key, what it used and where it stands (``gateway.access.usage``)."""
    state = require_admin(request, read_only=True)
    tallies = await views.usage_tallies(state) if state.fleet is not None else None
    return json_response(await usage_report(state.admission, tallies))
