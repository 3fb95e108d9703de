"""The console's routes (``gateway.console``): ``/admin/stats``, ``/admin/requests``,
``/admin/batches`` (JSON, for the page and for scripts) and, when ``server.ui`` is on, the
page itself under ``/ui``.

In a fleet the stats and recent requests are every worker's (``gateway.edge.views``).
The JSON views are read-only: they need the admin key when one is configured, and are
open when auth is off (``gateway.edge.ops.require_admin(read_only=True)``). The page's files are
read once when the router is built and served from memory with a strict
Content-Security-Policy (same origin only, no inline script), so the page works offline
and cannot load anything from elsewhere.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from backends.base import InvalidRequest
from gateway.batch.objects import Batch
from gateway.batch.runner import BatchRunner
from gateway.batch.store import Progress
from gateway.console.activity import RECENT_CAPACITY
from gateway.console.page import Asset, load_assets
from gateway.edge import views
from gateway.edge.ops import require_admin
from gateway.errors import RouteNotFound

_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _limit(raw: str | None, default: int = 100, most: int = RECENT_CAPACITY) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"limit must be an integer from 1 to {most}", param="limit")
    return int(raw)


BATCHES_SHOWN = 100
"""The most batches ``/admin/batches`` lists (newest first)."""


def batch_row(batch: Batch, progress: Progress) -> dict[str, Any]:
    """A batch as the API shows it to its key, plus what only an operator sees: the key
    that owns it, the lines started and not finished, and the lines run twice."""
    row = batch.to_json(progress.completed, progress.failed)
    row["owner"] = batch.owner
    row["request_counts"]["started"] = progress.started
    row["reruns"] = batch.reruns
    return row


def build_router(*, ui: bool) -> APIRouter:
    router = APIRouter()

    @router.get("/admin/stats")
    async def admin_stats(request: Request) -> Response:
        return _json(await views.stats(require_admin(request, read_only=True)))

    @router.get("/admin/requests")
    async def admin_requests(request: Request) -> Response:
        state = require_admin(request, read_only=True)
        query = request.query_params
        found = await views.recent(
            state,
            model=query.get("model") or None,
            status=query.get("status") or None,
            limit=_limit(query.get("limit")),
        )
        return _json({"requests": found})

    @router.get("/admin/batches")
    async def admin_batches(request: Request) -> Response:
        require_admin(request, read_only=True)
        limit = _limit(request.query_params.get("limit"), default=20, most=BATCHES_SHOWN)
        runner: BatchRunner = request.app.state.batch_runner
        found = await runner.state.recent(limit)
        return _json({"batches": [batch_row(batch, progress) for batch, progress in found]})

    if ui:
        _add_page(router, load_assets())
    return router


def _add_page(router: APIRouter, assets: dict[str, Asset]) -> None:
    headers = {
        "content-security-policy": _CSP,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "cache-control": "no-cache",
    }

    @router.get("/ui")
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=308)

    @router.get("/ui/{path:path}")
    async def ui_file(path: str, request: Request) -> Response:
        asset = assets.get(path or "index.html")
        if asset is None:
            raise RouteNotFound(f"no route for GET {request.url.path}")
        return Response(asset.body, media_type=asset.content_type, headers=headers)
