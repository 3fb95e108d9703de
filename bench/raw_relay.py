"""The raw relay: the floor under any Python gateway on llmso's own server stack.

The server ``llmso serve`` runs (uvicorn, uvloop with ``gateway.edge.accept``'s listener,
``CoalescingHttpToolsProtocol``) and the upstream client its openai backend uses
(``backends.openai_proxy.http1``), with nothing between them: the request body goes
upstream as it came, the answer's bytes come back as they arrive. No parsing, validation,
routing, re-framing, metrics or log line. Whatever llmso spends above this in the overhead
suite is the price of what llmso does per request::

    python -m bench.raw_relay --upstream http://127.0.0.1:8001 --port 8005
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from backends.openai_proxy.http1 import Pool
from gateway.cli import tune_gc
from gateway.edge.transport import CoalescingHttpToolsProtocol

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_CHAT = "/v1/chat/completions"


class RawRelay:
    """The ASGI app. Its pool is made on the first request (on the serving loop) and
    closed at shutdown; owned by that loop."""

    def __init__(self, upstream: str) -> None:
        self._url = upstream.rstrip("/") + _CHAT
        self._pool: Pool | None = None

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["path"] == _CHAT and scope["method"] == "POST":
            await self._relay(receive, send)
        elif scope["path"] == "/health":
            await _answer(send, 200, b"ok")
        else:
            await _answer(send, 404, b"not found")

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _relay(self, receive: Receive, send: Send) -> None:
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if self._pool is None:
            self._pool = Pool(headers={"Content-Type": "application/json"})
        response = await self._pool.post(self._url, b"".join(parts))
        try:
            kind = (response.header("content-type") or "application/json").encode("latin-1")
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [(b"content-type", kind)],
                }
            )
            while data := await response.read_some():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            response.release()


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:8001")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import uvicorn

    tune_gc()
    uvicorn.run(
        RawRelay(args.upstream),
        host=args.host,
        port=args.port,
        loop="gateway.edge.accept:new_loop",  # as llmso serve: batched accepts
        http=CoalescingHttpToolsProtocol,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


if __name__ == "__main__":
    main()
