"""The gateway's own CPU per streamed chat request, in process, without sockets.

One app built by ``build_app`` with a scripted backend (16 text deltas), driven through
its ASGI callable with a 16-token streamed chat body: the front door, parse, admission,
service, SSE frames and request record run as in ``llmso serve``; the server, the
upstream client and the kernel do not. Process CPU per request after a warm-up, so an
A/B of two trees (``PYTHONPATH=TREE python -m bench.inprocess_hop``, alternated) sees
changes to the gateway's Python that the overhead suite's loopback noise hides::

    python -m bench.inprocess_hop --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import orjson

from backends.base import (
    BackendEvent,
    Finished,
    GenerationRequest,
    ModelInfo,
    Started,
    TextDelta,
    Usage,
)
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app

BODY = orjson.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 16,
    }
)
HEADERS = [
    (b"host", b"127.0.0.1"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
]


class Scripted:
    """A backend answering every request with the same 16 deltas, at once."""

    def __init__(self, config: ModelConfig) -> None:
        self.name = config.name

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ready(self) -> bool:
        return True

    def info(self) -> ModelInfo:
        return ModelInfo(max_context=4096)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        yield Started(queued_at=request.arrival_time, started_at=request.arrival_time)
        for _ in range(16):
            yield TextDelta(index=0, text=" w")
        yield Finished(index=0, reason="length")
        yield Usage(prompt_tokens=5, completion_tokens=16)


async def measure(requests: int, warmup: int = 300) -> float:
    """Microseconds of process CPU per streamed request."""
    config = AppConfig.model_validate(
        {"models": [{"name": "m", "backend": "openai", "base_url": "http://unused"}]}
    )
    app = build_app(config, backend_factory=lambda model, _crash: Scripted(model))

    async def one() -> None:
        sent: list[MutableMapping[str, Any]] = []

        async def receive() -> MutableMapping[str, Any]:
            return {"type": "http.request", "body": BODY, "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": HEADERS,
            "query_string": b"",
            "client": ("127.0.0.1", 1),
        }
        await app(scope, receive, send)
        if sent[0].get("status") != 200:
            raise RuntimeError(f"the gateway answered {sent[0]}")

    async with app.lifespan():
        for _ in range(warmup):
            await one()
        gc.collect()
        gc.freeze()  # as llmso serve does after start-up
        try:
            began = time.process_time()
            for _ in range(requests):
                await one()
            return (time.process_time() - began) / requests * 1e6
        finally:
            gc.unfreeze()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    print(f"{asyncio.run(measure(args.requests)):.1f} us CPU per streamed request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
