"""The app's ASGI entry point: each generation route's path to its handler, the rest to
FastAPI.

Why not FastAPI for these: they carry every token. Measured with a fast fake upstream,
FastAPI's routing, its middleware stack (which wraps ``send`` once per layer) and
Starlette's ``StreamingResponse`` (an anyio task group per response) cost more CPU per
streamed request than everything llmso itself does. The operational routes stay on
FastAPI (``gateway.edge.ops``); ``GatewayASGI`` sends everything else there. Each
request is served by a ``gateway.edge.call.GenerationCall`` (or a subclass).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from gateway.api.completions import CompletionCall
from gateway.api.embeddings import EmbeddingCall
from gateway.api.responses.wire import ResponsesRequest
from gateway.api.wire import ChatCompletionRequest, CompletionRequest
from gateway.edge.call import ASGIApp, GenerationCall, Receive, Scope, Send
from gateway.edge.state import AppState
from gateway.service.embeddings import EmbeddingsWire


class GatewayASGI:
    """The app's ASGI entry point: generation routes here, the rest to FastAPI."""

    def __init__(self, api: ASGIApp, state: AppState) -> None:
        self.api = api
        self.state = state
        self._routes: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completion,
            "/v1/embeddings": self._embeddings,
            "/v1/responses": self._responses,
        }
        # For /openapi.json (gateway.edge.openapi): each route's wire type and summary.
        self.documented: dict[str, tuple[type[BaseModel], str]] = {
            "/v1/chat/completions": (ChatCompletionRequest, "Create a chat completion"),
            "/v1/completions": (CompletionRequest, "Create a completion"),
            "/v1/embeddings": (EmbeddingsWire, "Create embeddings"),
            "/v1/responses": (ResponsesRequest, "Create a model response"),
        }

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
            await self.state.frontdoor.serve_other(scope, receive, send, self.api)
        else:
            await self.state.frontdoor.serve(scope, receive, send, handler)

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        await GenerationCall(self.state, scope, receive, send).run_chat()

    async def _completion(self, scope: Scope, receive: Receive, send: Send) -> None:
        await CompletionCall(self.state, scope, receive, send).run_completion()

    async def _embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        await EmbeddingCall(self.state, scope, receive, send).run_embedding()

    async def _responses(self, scope: Scope, receive: Receive, send: Send) -> None:
        call = GenerationCall(self.state, scope, receive, send)
        await call.serve(lambda body: self.state.responses.prepare(body, call.record))
