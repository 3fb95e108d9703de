"""A bare FastAPI + aiohttp passthrough: the floor a Python gateway is compared against.

It relays ``POST /v1/chat/completions`` to one upstream and does nothing else: no
validation, no metrics, no re-framing, no usage accounting. ``llmso``'s overhead is
judged against this in the same run (see docs/benchmarks/README.md)::

    python -m bench.bare_passthrough --upstream http://127.0.0.1:8001 --port 8004 \\
        [--model fake-model]
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse


def build(upstream: str, model: str | None) -> FastAPI:
    sessions: list[aiohttp.ClientSession] = []

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sessions.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)))
        yield
        await sessions[0].close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> Response:  # for the harness's startup poll only
        return Response(b"ok")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        if model:
            body["model"] = model
        url = upstream + "/v1/chat/completions"
        if not body.get("stream"):
            async with sessions[0].post(url, json=body) as resp:
                return Response(
                    await resp.read(), status_code=resp.status, media_type="application/json"
                )
        resp = await sessions[0].post(url, json=body)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in resp.content.iter_any():
                    yield chunk
            finally:
                resp.release()

        return StreamingResponse(relay(), media_type="text/event-stream")

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--upstream", required=True, help="Upstream root, e.g. http://127.0.0.1:8001"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=None, help="Rewrite the request's model to this.")
    args = parser.parse_args(argv)
    app = build(args.upstream.rstrip("/"), args.model)
    uvicorn.run(
        app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level="warning"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
