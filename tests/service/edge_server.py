"""The gateway served the way ``llmso serve`` serves it (uvicorn on the protocol
``http_protocol`` makes) in front of a fake upstream, for tests that need the real server
protocol rather than an ASGI test client."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import NamedTuple

import uvicorn

from bench.fake_upstream import FakeOptions, FakeUpstream
from config.schema import AppConfig
from gateway.app import build_app
from gateway.edge.asgi import GatewayASGI
from gateway.edge.transport import http_protocol


class Served(NamedTuple):
    port: int
    fake: FakeUpstream
    app: GatewayASGI


@contextlib.asynccontextmanager
async def gateway_on_edge(
    options: FakeOptions, server: dict[str, object] | None = None, send_buffer: int | None = None
) -> AsyncIterator[Served]:
    """The gateway's port, its app and the fake it serves one model ``m`` (openai
    backend) from, with ``options``; ``server``: the config's ``server:`` section;
    ``send_buffer``: the kernel's send buffer of every client connection (``SO_SNDBUF``,
    which accepted sockets take from the listening one), else the kernel's own sizing."""
    fake = FakeUpstream(options)
    await fake.start()
    config = AppConfig.model_validate(
        {
            "server": server or {},
            "models": [{"name": "m", "backend": "openai", "base_url": fake.url + "/v1"}],
        }
    )
    sock = socket.socket()
    if send_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
    sock.bind(("127.0.0.1", 0))
    app = build_app(config)
    server = uvicorn.Server(
        uvicorn.Config(app, http=http_protocol(config.server.send_timeout), log_config=None)
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no start event
        await asyncio.sleep(0.01)
    try:
        yield Served(sock.getsockname()[1], fake, app)
    finally:
        server.should_exit = True
        await task
        await fake.stop()
