"""A tiny OpenAI-shaped aiohttp server for the bench tests (in-process or as a subprocess).

It emits ``max_tokens`` one-token content chunks ``delay_s`` apart, then (when asked for via
``stream_options.include_usage``) a usage chunk and ``[DONE]``. Model names steer behaviour:
``no-usage`` never reports usage, ``broken`` answers 500, ``hang`` never answers. Every
request body is recorded in ``app[BODIES]`` and the peak number of concurrent requests in
``app[PEAK]`` so tests can check what the load generator really did.

Run standalone: ``python -m tests.tools.bench_fake_server --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from aiohttp import web

BODIES: web.AppKey[list[dict[str, Any]]] = web.AppKey("bodies", list)
PEAK: web.AppKey[list[int]] = web.AppKey("peak", list)  # [current, peak]
DELAY: web.AppKey[float] = web.AppKey("delay", float)


def _chunk(api: str, text: str | None, usage: dict[str, int] | None = None) -> bytes:
    if api == "chat":
        choices = [] if text is None else [{"index": 0, "delta": {"content": text}}]
    else:
        choices = [] if text is None else [{"index": 0, "text": text}]
    payload: dict[str, Any] = {"object": "chunk", "choices": choices}
    if usage is not None:
        payload["usage"] = usage
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _generate(request: web.Request) -> web.StreamResponse:
    api = "chat" if request.path.endswith("chat/completions") else "completions"
    body = await request.json()
    request.app[BODIES].append(body)
    gauge = request.app[PEAK]
    gauge[0] += 1
    gauge[1] = max(gauge[1], gauge[0])
    try:
        return await _answer(request, api, body)
    finally:
        gauge[0] -= 1


async def _answer(request: web.Request, api: str, body: dict[str, Any]) -> web.StreamResponse:
    model = body.get("model")
    if model == "broken":
        return web.json_response({"error": {"message": "boom"}}, status=500)
    if model == "hang":
        await asyncio.sleep(3600)
    n = int(body.get("max_tokens", 16))
    delay = request.app[DELAY]
    usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
    if not body.get("stream"):
        await asyncio.sleep(delay * n)
        message = {"role": "assistant", "content": "tok " * n}
        choice = {"index": 0, "message": message} if api == "chat" else {"text": "tok " * n}
        return web.json_response({"choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(n):
        await asyncio.sleep(delay)
        await resp.write(_chunk(api, "tok "))
    include = (body.get("stream_options") or {}).get("include_usage")
    if include and model != "no-usage":
        await resp.write(_chunk(api, None, usage))
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake"}]})


def build_app(delay_s: float = 0.002) -> web.Application:
    app = web.Application()
    app[BODIES] = []
    app[PEAK] = [0, 0]
    app[DELAY] = delay_s
    app.router.add_post("/v1/chat/completions", _generate)
    app.router.add_post("/v1/completions", _generate)
    app.router.add_get("/v1/models", _models)
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.002)
    parser.add_argument("--tag", default="", help="Ignored; lets a test find its processes.")
    args = parser.parse_args()
    web.run_app(build_app(args.delay), host="127.0.0.1", port=args.port, print=None)
    sys.exit(0)
