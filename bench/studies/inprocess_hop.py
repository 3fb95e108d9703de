"""The gateway's own CPU per streamed chat request, in process, without sockets.

One app built by ``build_app`` with the tests' ``FakeBackend`` (``tests/tools``, here 16
text deltas at once), driven through its ASGI callable with a 16-token streamed chat
body: the front door, parse, admission, service, SSE frames and request record run as in
``llmso serve``; the server, the upstream client and the kernel do not. Process CPU per
request after a warm-up, so an A/B of two trees (``PYTHONPATH=TREE python -m
bench.studies.inprocess_hop``, alternated) sees changes to the gateway's Python that the
overhead suite's loopback noise hides. Run from a checkout (it imports ``tests.tools``)::

    python -m bench.studies.inprocess_hop --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import MutableMapping
from typing import Any

import orjson

from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.fake_backend import FakeBackend

# The test double echoes the prompt's words: 20 words, cut to 16 deltas by max_tokens.
PROMPT = " ".join(["w"] * 20)
BODY = orjson.dumps(
    {
        "model": "m",
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": 16,
    }
)
DATA_FRAMES = 1 + 16 + 1 + 1  # the role, 16 deltas, the finish reason, [DONE]
HEADERS = [
    (b"host", b"127.0.0.1"),
    (b"content-type", b"application/json"),
    (b"content-length", str(len(BODY)).encode()),
]


async def measure(requests: int, warmup: int = 300) -> float:
    """Microseconds of process CPU per streamed request."""
    config = AppConfig.model_validate(
        {"models": [{"name": "m", "backend": "openai", "base_url": "http://unused"}]}
    )
    app = build_app(config, backend_factory=lambda model, crash: FakeBackend(model, on_crash=crash))

    async def one() -> list[MutableMapping[str, Any]]:
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
        return sent

    async with app.lifespan():
        body = b"".join(message.get("body", b"") for message in await one())
        if body.count(b"data: ") != DATA_FRAMES or b"data: [DONE]" not in body:
            raise RuntimeError(f"not a {DATA_FRAMES}-frame stream: {body[:500]!r}")
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
    parser.add_argument("--warmup", type=int, default=300, help="Requests before measuring.")
    args = parser.parse_args(argv)
    per_request_us = asyncio.run(measure(args.requests, args.warmup))
    print(f"{per_request_us:.1f} us CPU per streamed request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
