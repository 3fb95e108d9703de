"""One benchmark request against an OpenAI-compatible server, timed chunk by chunk.

The client owns nothing global: callers pass one ``aiohttp.ClientSession`` (one pool for the
whole run) and get back a frozen :class:`RequestResult`. Every failure (HTTP status, broken
stream, timeout, SSE error event) becomes a result with ``ok=False``; nothing raises except
cancellation.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import orjson

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams
from backends.openai_proxy.payload import request_body
from backends.openai_proxy.stream import DONE, SSEDecoder
from bench.prompts import Prompt

Api = Literal["chat", "completions"]
_ERROR_BODY_LIMIT = 500


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What every request of a run sends; identical across the systems being compared."""

    base_url: str
    model: str
    api: Api = "chat"
    stream: bool = True
    max_tokens: int = 64
    temperature: float = 0.0
    ignore_eos: bool = True
    timeout_s: float = 300.0
    api_key: str | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        path = "chat/completions" if self.api == "chat" else "completions"
        return f"{self.base_url.rstrip('/')}/{path}"


@dataclass(frozen=True, slots=True)
class RequestResult:
    """Timings of one request, in seconds; ``start`` is relative to the run's clock origin.

    ``chunk_times`` holds the arrival time (relative to ``start``) of every SSE chunk that
    carried generated text; for non-streaming requests it is empty. ``tokens_from_usage`` tells
    whether ``output_tokens`` came from the server's ``usage`` or from counting chunks.
    """

    index: int
    prompt_index: int
    ok: bool
    status: int
    start: float
    e2e: float
    ttft: float | None
    chunk_times: tuple[float, ...]
    output_tokens: int
    prompt_tokens: int | None
    tokens_from_usage: bool
    error: str | None = None
    warmup: bool = False

    @property
    def itls(self) -> tuple[float, ...]:
        """Gaps between consecutive content chunks (``len(chunk_times) - 1`` values)."""
        return inter_token_gaps(self.chunk_times)

    @property
    def end(self) -> float:
        return self.start + self.e2e

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "prompt_index": self.prompt_index,
            "ok": self.ok,
            "status": self.status,
            "start": round(self.start, 6),
            "e2e": round(self.e2e, 6),
            "ttft": None if self.ttft is None else round(self.ttft, 6),
            "chunk_times": [round(t, 6) for t in self.chunk_times],
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tokens_from_usage": self.tokens_from_usage,
            "error": self.error,
            "warmup": self.warmup,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestResult:
        return cls(
            index=int(data["index"]),
            prompt_index=int(data["prompt_index"]),
            ok=bool(data["ok"]),
            status=int(data["status"]),
            start=float(data["start"]),
            e2e=float(data["e2e"]),
            ttft=None if data.get("ttft") is None else float(data["ttft"]),
            chunk_times=tuple(float(t) for t in data.get("chunk_times", ())),
            output_tokens=int(data["output_tokens"]),
            prompt_tokens=None if data.get("prompt_tokens") is None else int(data["prompt_tokens"]),
            tokens_from_usage=bool(data.get("tokens_from_usage", False)),
            error=data.get("error"),
            warmup=bool(data.get("warmup", False)),
        )


def inter_token_gaps(chunk_times: tuple[float, ...]) -> tuple[float, ...]:
    """Differences between consecutive arrival times (empty for fewer than two chunks)."""
    return tuple(b - a for a, b in itertools.pairwise(chunk_times))


def raw_chat_post(
    model: str, max_tokens: int, *, stream: bool = True, content: str = "hi", **extra: object
) -> bytes:
    """One ``POST /v1/chat/completions`` as the bytes of an HTTP/1.1 request, for a client
    that drives its socket by hand (a reader that stalls, a connection cut mid-stream, the
    per-chunk study's minimal client)."""
    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "stream": stream,
            **extra,
        }
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def build_body(options: RequestOptions, prompt: Prompt) -> dict[str, Any]:
    """The body every system receives, built by the gateway's own body builder."""
    chat = options.api == "chat"
    request = GenerationRequest(
        request_id="bench",
        model=options.model,
        kind=RequestKind.CHAT if chat else RequestKind.COMPLETION,
        sampling=SamplingParams(
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            ignore_eos=options.ignore_eos,
        ),
        messages=(ChatMessage("user", prompt.text),) if chat else (),
        prompt="" if chat else prompt.text,
    )
    # vLLM honours ignore_eos; servers that do not know it ignore unknown fields.
    body = request_body(request, options.model, stream=options.stream, send_ignore_eos=True)
    body.update(options.extra_body)
    return body


def _chunk_text(payload: dict[str, Any], api: Api) -> str:
    choices = payload.get("choices") or ()
    parts = []
    for choice in choices:
        if api == "chat":
            delta = choice.get("delta") or {}
            parts.append(delta.get("content") or "")
        else:
            parts.append(choice.get("text") or "")
    return "".join(parts)


def _usage(payload: dict[str, Any]) -> tuple[int | None, int | None]:
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None, None
    completion = usage.get("completion_tokens")
    prompt = usage.get("prompt_tokens")
    return (
        completion if isinstance(completion, int) else None,
        prompt if isinstance(prompt, int) else None,
    )


@dataclass(slots=True)
class _Progress:
    """Mutable scratch of one in-flight request; owned by the coroutine running it."""

    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None


async def _read_stream(
    resp: aiohttp.ClientResponse, api: Api, t0: float, progress: _Progress
) -> None:
    decoder = SSEDecoder()  # the gateway's own parser: one reading of SSE for both
    async for data in resp.content.iter_any():
        now = time.perf_counter()
        for payload in decoder.feed(data):
            if _take(payload, api, now - t0, progress):
                return
    for payload in decoder.flush():
        if _take(payload, api, time.perf_counter() - t0, progress):
            return
    progress.error = progress.error or "stream ended without [DONE]"


def _take(data: bytes, api: Api, at: float, progress: _Progress) -> bool:
    """Record one ``data:`` payload that arrived ``at`` seconds in; True at ``[DONE]``."""
    if data == DONE:
        return True
    payload = orjson.loads(data)
    if not isinstance(payload, dict):
        return False
    if "error" in payload:
        progress.error = f"stream error: {str(payload['error'])[:_ERROR_BODY_LIMIT]}"
        return False
    if _chunk_text(payload, api):
        progress.chunk_times.append(at)
    completion, prompt = _usage(payload)
    if completion is not None:
        progress.completion_tokens = completion
        progress.prompt_tokens = prompt
    return False


async def _read_whole(resp: aiohttp.ClientResponse, api: Api, progress: _Progress) -> None:
    payload = orjson.loads(await resp.read())
    if not isinstance(payload, dict):
        progress.error = "response is not a JSON object"
        return
    completion, prompt = _usage(payload)
    progress.completion_tokens = completion
    progress.prompt_tokens = prompt
    if completion is None:
        progress.error = "non-streaming response without usage.completion_tokens"
    choices = payload.get("choices") or ()
    if api == "chat" and not any((c.get("message") or {}).get("content") for c in choices):
        progress.error = progress.error or "empty completion"


async def send_request(
    session: aiohttp.ClientSession,
    options: RequestOptions,
    prompt: Prompt,
    index: int,
    clock_origin: float,
    *,
    warmup: bool = False,
) -> RequestResult:
    """Send one request and time it; never raises except ``CancelledError``."""
    headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else None
    body = orjson.dumps(build_body(options, prompt))
    progress = _Progress()
    status = 0
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(options.timeout_s):
            async with session.post(
                options.url,
                data=body,
                headers={"Content-Type": "application/json", **(headers or {})},
            ) as resp:
                status = resp.status
                if status != 200:
                    text = (await resp.text(errors="replace"))[:_ERROR_BODY_LIMIT]
                    progress.error = f"HTTP {status}: {text}"
                elif options.stream:
                    await _read_stream(resp, options.api, t0, progress)
                else:
                    await _read_whole(resp, options.api, progress)
    except TimeoutError:
        progress.error = f"timeout after {options.timeout_s:g}s"
    except (aiohttp.ClientError, ValueError) as exc:  # JSON and oversized lines too
        progress.error = f"{type(exc).__name__}: {exc}"[:_ERROR_BODY_LIMIT]
    e2e = time.perf_counter() - t0
    chunks = tuple(progress.chunk_times)
    from_usage = progress.completion_tokens is not None
    output_tokens = progress.completion_tokens if from_usage else len(chunks)
    ok = progress.error is None and status == 200 and (output_tokens or 0) > 0
    error = progress.error
    if error is None and not ok:
        error = "no tokens generated"
    ttft: float | None = chunks[0] if chunks else (e2e if ok and not options.stream else None)
    return RequestResult(
        index=index,
        prompt_index=prompt.index,
        ok=ok,
        status=status,
        start=t0 - clock_origin,
        e2e=e2e,
        ttft=ttft,
        chunk_times=chunks,
        output_tokens=output_tokens or 0,
        prompt_tokens=progress.prompt_tokens,
        tokens_from_usage=from_usage,
        error=error,
        warmup=warmup,
    )
