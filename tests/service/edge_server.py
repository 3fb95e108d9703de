"""The gateway served the way ``llmso serve`` serves it (uvicorn on
``CoalescingHttpToolsProtocol``) in front of a fake upstream, for tests that need the
real server protocol rather than an ASGI test client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn

from bench.fake_upstream import FakeOptions, FakeUpstream
from config.schema import AppConfig
from gateway.app import build_app
from gateway.edge.transport import CoalescingHttpToolsProtocol


@contextlib.asynccontextmanager
async def gateway_on_edge(options: FakeOptions) -> AsyncIterator[tuple[int, FakeUpstream]]:
    """``(port, fake)``: one model ``m`` (openai backend) over a fake with ``options``."""
    fake = FakeUpstream(options)
    await fake.start()
    config = AppConfig.model_validate(
        {"models": [{"name": "m", "backend": "openai", "base_url": fake.url + "/v1"}]}
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(build_app(config), http=CoalescingHttpToolsProtocol, log_config=None)
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no start event
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1], fake
    finally:
        server.should_exit = True
        await task
        await fake.stop()
