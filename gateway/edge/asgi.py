"""The app's ASGI entry point: each public endpoint's path to its handler, the rest to
FastAPI.

Why not FastAPI for these: they carry every token. Measured with a fast fake upstream,
FastAPI's routing, its middleware stack (which wraps ``send`` once per layer) and
Starlette's ``StreamingResponse`` (an anyio task group per response) cost more CPU per
streamed request than everything llmso itself does. The operational routes stay on
FastAPI (``gateway.edge.ops``); ``GatewayASGI`` sends everything else there. Each
request is served by a ``gateway.edge.call.EndpointCall`` running its ``Endpoint``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from gateway.api.base import Endpoint
from gateway.edge.asgi_types import ASGIApp, Receive, Scope, Send
from gateway.edge.call import EndpointCall
from gateway.edge.state import AppState


class GatewayASGI:
    """The app's ASGI entry point: the public endpoints here, the rest to FastAPI."""

    def __init__(self, api: ASGIApp, state: AppState, endpoints: Sequence[Endpoint]) -> None:
        self.api = api
        self.state = state
        self._routes: dict[str, ASGIApp] = {e.path: self._handler(e) for e in endpoints}
        # For /openapi.json (gateway.edge.openapi): each route's wire type and summary.
        self.documented: dict[str, tuple[type[BaseModel], str]] = {
            e.path: (e.wire, e.summary) for e in endpoints
        }

    def _handler(self, endpoint: Endpoint) -> ASGIApp:
        state = self.state

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            await EndpointCall(state, scope, receive, send).serve(endpoint)

        return handle

    def lifespan(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The app's start-up and shut-down, for tests that drive it without a server."""
        api: Any = self.api
        context: contextlib.AbstractAsyncContextManager[None] = api.router.lifespan_context(api)
        return context

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)
            return
        handler = self._routes.get(scope["path"])
        # The front door: Host, method, Content-Type, key, body deadline, accounting.
        if handler is None:
            await self.state.door.serve_other(scope, receive, send, self.api)
        else:
            await self.state.door.serve(scope, receive, send, handler)
