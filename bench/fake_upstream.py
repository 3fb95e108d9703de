"""A fast fake OpenAI-compatible upstream server (aiohttp), for tests and benchmarks.

Run it standalone (the overhead benchmark does)::

    python -m bench.fake_upstream --port P [--host 127.0.0.1] [--chunks 16]
        [--delay-ms D] [--ttft-ms T] [--model fake-model] [--no-usage] [--mlx-usage]
        [--cached-tokens K]

Flags:
  --port P        TCP port to listen on (0 = any free port; the chosen one is printed).
  --host H        interface to bind (default 127.0.0.1).
  --chunks N      content tokens per choice when the request sets no smaller max_tokens
                  (default 16). A request's max_tokens < N ends with finish_reason "length".
  --delay-ms D    sleep between two streamed chunks (default 0: write as fast as possible).
  --ttft-ms T     sleep before the first chunk (default 0).
  --model NAME    the served model id; other ids get 404 like vLLM (default fake-model).
  --no-usage      ignore stream_options.include_usage, like llama.cpp.
  --mlx-usage     label the usage chunk ``object: chat.completion``, like mlx-lm.
  --cached-tokens K  report up to K prompt tokens as read from a prefix cache
                  (``usage.prompt_tokens_details.cached_tokens``, as vLLM does with
                  ``--enable-prompt-tokens-details``); 0 (default) sends no such field.
  --tag T         ignored; lets a test find the processes it started.

Endpoints: POST /v1/chat/completions and /v1/completions (streaming with SSE or not;
``n``, ``stop``, ``logprobs``/``top_logprobs`` and ``stream_options.include_usage``
honoured),
GET /v1/models (with ``max_model_len``), GET /health, GET /metrics (running/aborted
counters as text, and vLLM's load gauges: ``vllm:num_requests_running`` is the live
count, ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` read the ``waiting``
and ``kv_usage`` attributes a test sets to fake an engine's queue), POST /v1/traces (an
OTLP/HTTP sink that drops what it gets). Output is deterministic: choice text is a fixed
word cycle, so a greedy stream equals a non-stream answer. An answer that was cut short
continues where the request's text leaves the cycle, as an engine continues a prefix:
chat with vLLM's ``continue_final_message`` (and ``add_generation_prompt: false``) and a
final assistant message, or a completion prompt ending in the cycle's first K words; the
answer then holds the cycle's words K.. of ``--chunks`` in all. Validation errors answer in
vLLM's shape.

In tests, ``FakeUpstream`` runs the same app in-process, lets a test inject faults
consumed one per request with ``fake.faults.append(...)``:

- an int: answer with that HTTP status and an error body;
- ``"disconnect"``: drop the connection before answering;
- ``"cut"``: drop it after the first event (chat: the role chunk, before any token);
- ``"break"``: drop it after three events;
- ``"garbage"``: send invalid JSON as the third event;
- ``"stall"``: send headers, then nothing until the client leaves;
- ``"empty"``: answer 200 with an empty stream (llama.cpp's way of rejecting);
- ``"reset"``: answer 200 headers, then drop the connection (its other way);
- ``"<fault>@K"`` after K tokens of the answer: ``break`` (drop the connection),
  ``garbage`` (invalid JSON), ``error`` (an ``{"error": ...}`` event), ``eof`` (end the
  body without ``[DONE]``), ``stall`` (nothing more until the client leaves);

and read its counters (``running``, ``peak``, ``aborted``, ``completed``, ``bodies``,
``headers``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

WORDS = (
    "Hello",
    " world",
    ",",
    " this",
    " is",
    " a",
    " fake",
    " stream",
    " of",
    " tokens",
    ".",
)
MAX_MODEL_LEN = 2048


@dataclass
class FakeOptions:
    chunks: int = 16
    delay_ms: float = 0.0
    ttft_ms: float = 0.0
    model: str = "fake-model"
    usage: bool = True
    mlx_usage: bool = False
    cached_tokens: int = 0


class FakeUpstream:
    """The fake server's state and handlers. Owned by the event loop that serves it."""

    def __init__(self, options: FakeOptions | None = None) -> None:
        self.options = options or FakeOptions()
        self.faults: deque[int | str] = deque()
        self.healthy = True
        self.running = 0
        self.peak = 0
        """Most streams served at once (a load generator's concurrency, as the server saw it)."""
        self.aborted = 0
        self.completed = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.trace_exports = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/traces", self._traces)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ handlers

    async def _models(self, request: web.Request) -> web.Response:
        if not self.healthy:
            return _error(503, "unhealthy", None)
        data = {"object": "model", "id": self.options.model, "max_model_len": MAX_MODEL_LEN}
        return _json({"object": "list", "data": [data]})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        text = f"fake_running {self.running}\nfake_aborted {self.aborted}\n"
        model = f'{{model_name="{self.options.model}"}}'
        text += f"vllm:num_requests_running{model} {self.running}\n"
        text += f"vllm:num_requests_waiting{model} {self.waiting}\n"
        text += f"vllm:kv_cache_usage_perc{model} {self.kv_usage}\n"
        return web.Response(text=f"{text}fake_completed {self.completed}\n")

    async def _traces(self, request: web.Request) -> web.Response:
        """An OTLP/HTTP sink: accepts (and drops) span exports, so a traced gateway in the
        overhead benchmark exports somewhere real."""
        await request.read()
        self.trace_exports += 1
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, "body is not JSON", None)
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        fault = self.faults.popleft() if self.faults else None
        if isinstance(fault, int):
            return _error(fault, f"injected failure {fault}", None)
        if fault == "disconnect":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        problem = self._validate(body, chat=chat)
        if problem is not None:
            return problem
        plan = _Plan.of(body, self.options, chat=chat)
        if not body.get("stream"):
            await self._sleep(self.options.ttft_ms + self.options.delay_ms * plan.tokens)
            self.completed += 1
            return _json(plan.full_response())
        return await self._stream(request, plan, fault)

    async def _stream(
        self, request: web.Request, plan: _Plan, fault: int | str | None
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await response.prepare(request)
            if fault == "empty":  # how llama.cpp answers a streaming request it rejects
                await response.write_eof()
                return response
            if fault == "reset":  # ... or, as often, by dropping the connection
                assert request.transport is not None
                request.transport.close()
                return response
            await self._sleep(self.options.ttft_ms)
            if fault == "stall":
                await _until_closed(request)
                raise ConnectionResetError("client left a stalled stream")
            name, _, at = str(fault).partition("@")
            cut = plan.lead + int(at) if at else -1  # the event after K tokens
            for i, event in enumerate(plan.events(self.options)):
                if i and self.options.delay_ms:
                    await asyncio.sleep(self.options.delay_ms / 1000)
                if i == cut and await _mid_stream_fault(name, request, response):
                    break
                if fault == "garbage" and i == 2:
                    await response.write(b"data: {not json\n\n")
                    break
                if (fault == "break" and i == 3) or (fault == "cut" and i == 1):
                    assert request.transport is not None
                    request.transport.close()
                    break
                await response.write(event)
            else:
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
                self.completed += 1
        except asyncio.CancelledError:
            self.aborted += 1
            raise
        except ConnectionError:  # the client left: what an engine counts as an abort
            self.aborted += 1
        finally:
            self.running -= 1
        return response

    def _validate(self, body: dict[str, Any], *, chat: bool) -> web.Response | None:
        if chat and body.get("continue_final_message"):
            if body.get("add_generation_prompt", True):
                return _error(
                    400,
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                    None,
                )
            messages = body.get("messages") or [{}]
            if messages[-1].get("role") != "assistant":
                return _error(400, "continue_final_message needs an assistant message", None)
        model = body.get("model")
        if model != self.options.model:
            return _error(404, f"The model `{model}` does not exist.", "model", "NotFoundError")
        max_tokens = body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            return _error(400, "max_tokens must be at least 1", "max_tokens")
        if float(body.get("temperature", 1.0)) < 0:
            return _error(400, "temperature must be non-negative", "temperature")
        text = _prompt_text(body, chat=chat)
        if len(text.split()) + 1 > MAX_MODEL_LEN:
            return _error(
                400,
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, "
                "your request has more input tokens.",
                None,
            )
        return None

    @staticmethod
    async def _sleep(ms: float) -> None:
        if ms > 0:
            await asyncio.sleep(ms / 1000)


@dataclass(frozen=True)
class _Plan:
    """What one request will produce."""

    chat: bool
    model: str
    n: int
    start: int
    """Words of the cycle already in the request (a continuation starts after them)."""
    tokens: int
    finish: str
    prompt_tokens: int
    logprobs: int | None
    include_usage: bool
    cached: int | None
    """Prompt tokens reported as cached (None: no ``prompt_tokens_details``)."""

    @staticmethod
    def of(body: dict[str, Any], options: FakeOptions, *, chat: bool) -> _Plan:
        max_tokens = body.get("max_tokens")
        start = min(_continued_words(body, chat=chat), options.chunks)
        left = options.chunks - start
        tokens = left if max_tokens is None else min(left, max_tokens)
        stopped = _words_before_stop(start, tokens, body.get("stop"))
        if chat:
            logprobs = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
        else:
            raw = body.get("logprobs")
            logprobs = int(raw) if raw is not None else None
        stream_options = body.get("stream_options") or {}
        return _Plan(
            chat=chat,
            model=body["model"],
            n=int(body.get("n") or 1),
            start=start,
            tokens=tokens if stopped is None else stopped,
            finish="length" if tokens < left and stopped is None else "stop",
            prompt_tokens=len(_prompt_text(body, chat=chat).split()) + 1,
            logprobs=logprobs,
            include_usage=bool(stream_options.get("include_usage")) and options.usage,
            cached=options.cached_tokens or None,
        )

    @property
    def lead(self) -> int:
        """Events before the first token: the role chunks of chat."""
        return self.n if self.chat else 0

    def _base(self, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl" if self.chat else "cmpl"
        return {"id": f"{prefix}-fake", "object": obj, "created": 0, "model": self.model}

    def usage(self) -> dict[str, Any]:
        completion = self.tokens * self.n
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }
        if self.cached is not None:
            cached = min(self.cached, self.prompt_tokens)
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    def events(self, options: FakeOptions) -> list[bytes]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = []
        if self.chat:
            for index in range(self.n):
                role = {"index": index, "delta": {"role": "assistant", "content": ""}}
                out.append(_sse({**self._base(obj), "choices": [role]}))
        for t in range(self.tokens):
            last = t == self.tokens - 1
            for index in range(self.n):
                choice = self._choice_piece(index, t, last)
                out.append(_sse({**self._base(obj), "choices": [choice]}))
        if self.include_usage:
            kind = "chat.completion" if options.mlx_usage and self.chat else obj
            out.append(_sse({**self._base(kind), "choices": [], "usage": self.usage()}))
        return out

    def _choice_piece(self, index: int, t: int, last: bool) -> dict[str, Any]:
        word = WORDS[(self.start + t) % len(WORDS)]
        piece: dict[str, Any] = {"index": index}
        if self.chat:
            piece["delta"] = {"content": word}
        else:
            piece["text"] = word
        piece["logprobs"] = self._logprobs([word]) if self.logprobs is not None else None
        piece["finish_reason"] = self.finish if last else None
        return piece

    def _logprobs(self, words: list[str]) -> dict[str, Any]:
        k = self.logprobs or 0
        if self.chat:
            content = []
            for word in words:
                alts = [word, *(f"alt{j}" for j in range(k - 1))][:k]
                top = [_chat_lp(alt, -0.5 - j) for j, alt in enumerate(alts)]
                content.append({**_chat_lp(word, -0.5), "top_logprobs": top})
            return {"content": content}
        return {
            "tokens": words,
            "token_logprobs": [-0.5 for _ in words],
            "top_logprobs": [
                {alt: -0.5 - j for j, alt in enumerate([w, *(f"alt{j}" for j in range(k - 1))][:k])}
                for w in words
            ],
            "text_offset": [0 for _ in words],
        }

    def full_response(self) -> dict[str, Any]:
        text_tokens = [WORDS[(self.start + t) % len(WORDS)] for t in range(self.tokens)]
        text = "".join(text_tokens)
        logprobs = self._logprobs(text_tokens) if self.logprobs is not None else None
        choices = []
        for index in range(self.n):
            choice: dict[str, Any] = {"index": index, "finish_reason": self.finish}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choice["logprobs"] = logprobs
            choices.append(choice)
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._base(obj), "choices": choices, "usage": self.usage()}


def _continued_words(body: dict[str, Any], *, chat: bool) -> int:
    """How many words of the cycle the request already holds at its end (see the module
    doc): 0 for an ordinary request."""
    if chat:
        messages = body.get("messages") or [{}]
        if not body.get("continue_final_message"):
            return 0
        return _cycle_words(str(messages[-1].get("content") or "")) or 0
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        return 0
    at = prompt.find(WORDS[0])
    while at >= 0:  # the longest tail that is the cycle's start
        words = _cycle_words(prompt[at:])
        if words is not None:
            return words
        at = prompt.find(WORDS[0], at + 1)
    return 0


def _cycle_words(text: str) -> int | None:
    """K when ``text`` is the cycle's first K words exactly, else None."""
    done, k = 0, 0
    while done < len(text):
        word = WORDS[k % len(WORDS)]
        if not text.startswith(word, done):
            return None
        done += len(word)
        k += 1
    return k


async def _mid_stream_fault(name: str, request: web.Request, response: web.StreamResponse) -> bool:
    """Inject fault ``name`` into a stream under way; True when the stream ends here."""
    if name == "garbage":
        await response.write(b"data: {not json\n\n")
    elif name == "error":
        error = {"message": "injected failure mid-stream", "type": "InternalServerError"}
        await response.write(_sse({"error": error}))
    elif name == "eof":
        await response.write_eof()
    elif name == "stall":
        await _until_closed(request)
        raise ConnectionResetError("client left a stalled stream")
    elif name == "break":
        assert request.transport is not None
        request.transport.close()
    else:
        return False
    return True


def _words_before_stop(start: int, tokens: int, stop: Any) -> int | None:
    """How many whole words come before the first stop string, or None if none occurs
    (the fake stops at word boundaries, which is where the contract suite's stops fall)."""
    stops = [stop] if isinstance(stop, str) else [s for s in stop or () if s]
    text, ends = "", []
    for t in range(start, start + tokens):
        text += WORDS[t % len(WORDS)]
        ends.append(len(text))
    found = [text.index(s) for s in stops if s in text]
    if not found:
        return None
    return sum(end <= min(found) for end in ends)


async def _until_closed(request: web.Request) -> None:
    """Wait until the client drops the connection (aiohttp does not cancel handlers)."""
    transport = request.transport
    while transport is not None and not transport.is_closing():  # noqa: ASYNC110 (no event to await)
        await asyncio.sleep(0.02)


def _chat_lp(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode())}


def _prompt_text(body: dict[str, Any], *, chat: bool) -> str:
    if chat:
        return " ".join(str(m.get("content", "")) for m in body.get("messages") or ())
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _json(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def _error(
    status: int, message: str, param: str | None, kind: str = "BadRequestError"
) -> web.Response:
    error = {"message": message, "type": kind, "param": param, "code": status}
    return _json({"error": error, "object": "error"}, status=status)


async def _serve_forever(options: FakeOptions, host: str, port: int) -> None:
    fake = FakeUpstream(options)
    await fake.start(host, port)
    print(f"fake upstream listening on http://{host}:{fake.port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await fake.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--ttft-ms", type=float, default=0.0)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--no-usage", action="store_true")
    parser.add_argument("--mlx-usage", action="store_true")
    parser.add_argument("--cached-tokens", type=int, default=0)
    parser.add_argument("--tag", default="", help="Ignored; lets a test find its processes.")
    args = parser.parse_args(argv)
    options = FakeOptions(
        chunks=args.chunks,
        delay_ms=args.delay_ms,
        ttft_ms=args.ttft_ms,
        model=args.model,
        usage=not args.no_usage,
        mlx_usage=args.mlx_usage,
        cached_tokens=args.cached_tokens,
    )
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(_serve_forever(options, args.host, args.port))


if __name__ == "__main__":
    main()
