"""A scripted OpenAI-compatible upstream for a reasoning model, as vLLM 0.32 serves one.

It thinks ``Let me think about <last user message>.`` and answers ``It is <last word>.``,
one word a chunk. ``split`` (vLLM started with ``--reasoning-parser``): the thought comes
in each delta's ``reasoning`` field only (and as ``message.reasoning`` when not
streamed), and usage reports ``completion_tokens_details.reasoning_tokens: 0``, as vLLM
0.32 does; not ``split`` (a server without a parser): the thought is plain content,
``thought</think>answer`` as a DeepSeek-R1 template leaves it. It honours
``chat_template_kwargs.enable_thinking: false`` (no thought) and ``thinking_token_budget``
(the thought cut to that many words), and keeps every request body in ``bodies``.
Owned by the event loop that runs it.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

MODEL = "thinker"


class ThinkingUpstream:
    def __init__(self, *, split: bool = True) -> None:
        self.split = split
        self.bodies: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        models = [{"id": MODEL, "object": "model", "max_model_len": 4096}]
        return web.json_response({"object": "list", "data": models})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    def thought_and_answer(self, body: dict[str, Any]) -> tuple[list[str], list[str]]:
        """The words of the thought and of the answer ``body`` gets."""
        last = next(m for m in reversed(body["messages"]) if m["role"] == "user")
        content = last["content"]
        text = content if isinstance(content, str) else " ".join(p["text"] for p in content)
        topic = text.split() or ["nothing"]
        thought = _words(f"Let me think about {' '.join(topic)}.")
        if (body.get("chat_template_kwargs") or {}).get("enable_thinking") is False:
            thought = []
        budget = body.get("thinking_token_budget")
        if budget is not None:
            thought = thought[:budget]
        return thought, _words(f"It is {topic[-1]}.")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        thought, answer = self.thought_and_answer(body)
        limit = body.get("max_tokens") or body.get("max_completion_tokens") or 10_000
        pieces = [("reasoning", word) for word in thought]
        if thought and not self.split:
            pieces = [("content", word) for word in thought] + [("content", "</think>")]
        pieces += [("content", word) for word in answer]
        reason = "length" if len(pieces) > limit else "stop"
        pieces = pieces[:limit]
        if not body.get("stream"):
            return web.json_response(self._whole(pieces, reason))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_sse(_chunk({"role": "assistant", "content": ""})))
        for field, word in pieces:
            await response.write(_sse(_chunk({field: word})))
        await response.write(_sse(_chunk({}, reason)))
        if (body.get("stream_options") or {}).get("include_usage"):
            await response.write(_sse({"id": "c", "choices": [], "usage": _usage(len(pieces))}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    @staticmethod
    def _whole(pieces: list[tuple[str, str]], reason: str) -> dict[str, Any]:
        thought = "".join(word for field, word in pieces if field == "reasoning")
        answer = "".join(word for field, word in pieces if field == "content")
        message = {"role": "assistant", "content": answer or None, "reasoning": thought or None}
        choice = {"index": 0, "message": message, "finish_reason": reason}
        return {"id": "c", "object": "chat.completion", "model": MODEL, "choices": [choice],
                "usage": _usage(len(pieces))}  # fmt: skip


def _words(text: str) -> list[str]:
    words = text.split(" ")
    return [word if i == 0 else " " + word for i, word in enumerate(words)]


def _chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    return {"id": "c", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]}


def _usage(completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": 7,
        "completion_tokens": completion,
        "total_tokens": 7 + completion,
        "completion_tokens_details": {"reasoning_tokens": 0},  # vLLM 0.32 says 0
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"
