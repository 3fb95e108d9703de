"""A relay in front of one engine server that, when armed, slips an invalid event into
the next stream it relays: the failover drill's "replica answering garbage mid-stream".

    python -m tests.tools.garbling_proxy --upstream http://127.0.0.1:P --port Q

Every request is relayed to ``--upstream`` as it came, and its answer back as it comes.
``POST /_arm {"after": K}`` arms it: the next streamed answer gets ``data: {garbage``
after its K-th ``data:`` line with text in it, and the rest of the stream follows
untouched (the engine keeps going; only the consumer can tell). ``GET /_state`` answers
``{"armed": bool, "garbled": n}``. State lives in the one event loop serving it.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import orjson
from aiohttp import web

GARBAGE = b'data: {"choices": [{"delta": {"content": "\xff\n\n'
_HOP = {"host", "content-length", "transfer-encoding", "connection"}


class GarblingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.after: int | None = None
        self.garbled = 0
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/_arm", self._arm)
        app.router.add_get("/_state", self._state)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def _close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def _arm(self, request: web.Request) -> web.Response:
        self.after = int(orjson.loads(await request.read())["after"])
        return web.json_response({"armed": True})

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response({"armed": self.after is not None, "garbled": self.garbled})

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        body = await request.read()
        url = self.upstream + str(request.rel_url)
        try:
            async with self.session.request(
                request.method, url, data=body, headers=headers
            ) as upstream:
                answer = web.StreamResponse(status=upstream.status)
                kind = upstream.headers.get("Content-Type")
                if kind:
                    answer.headers["Content-Type"] = kind
                await answer.prepare(request)
                streaming = (kind or "").startswith("text/event-stream")
                after, self.after = (self.after, None) if streaming else (None, self.after)
                await self._copy(upstream, answer, after)
                await answer.write_eof()
                return answer
        except (aiohttp.ClientError, ConnectionError):
            raise web.HTTPBadGateway() from None

    async def _copy(
        self, upstream: aiohttp.ClientResponse, answer: web.StreamResponse, after: int | None
    ) -> None:
        if after is None:
            async for chunk in upstream.content.iter_any():
                await answer.write(chunk)
            return
        texts = 0
        async for line in upstream.content:  # one line at a time: count the events
            await answer.write(line)
            if _has_text(line):
                texts += 1
                if texts == after:
                    # End the K-th event and let it go out alone: a consumer drops the
                    # valid events of a read that also holds the garbage, and the break
                    # must fall exactly after the K-th delta.
                    await answer.write(b"\n")
                    await asyncio.sleep(0.05)
                    await answer.write(GARBAGE)
                    self.garbled += 1


def _has_text(line: bytes) -> bool:
    """Whether an SSE line is a chunk carrying answer text (chat or completions)."""
    if not line.startswith(b"data: {"):
        return False
    choices = orjson.loads(line[6:]).get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return bool(delta.get("content") or choices[0].get("text"))


async def _serve(upstream: str, port: int) -> None:
    runner = web.AppRunner(GarblingProxy(upstream).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"garbling proxy on http://127.0.0.1:{port} -> {upstream}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.upstream, args.port))


if __name__ == "__main__":
    main()
