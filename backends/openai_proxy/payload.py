"""Build the upstream request body from a ``GenerationRequest``. Pure functions.

The body always streams with ``stream_options.include_usage`` so token counts come back
from engines that support it; optional fields are sent only when they differ from the
OpenAI defaults, so strict servers see a minimal body.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import GenerationRequest, RequestKind
from backends.openai_proxy.engines import EngineProfile

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"


def build_body(
    request: GenerationRequest, upstream_model: str, profile: EngineProfile
) -> tuple[str, bytes]:
    """``(path under the API root, JSON body)`` for one request."""
    chat = request.kind is RequestKind.CHAT
    body = request_body(
        request, upstream_model, stream=True, send_ignore_eos=profile.accepts_ignore_eos
    )
    return (CHAT_PATH if chat else COMPLETIONS_PATH), orjson.dumps(body)


def request_body(
    request: GenerationRequest, model: str, *, stream: bool, send_ignore_eos: bool
) -> dict[str, Any]:
    """The OpenAI request body for ``request`` (the proxy's and the benchmark client's)."""
    body: dict[str, Any] = {"model": model}
    chat = request.kind is RequestKind.CHAT
    if chat:
        body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
    else:
        body["prompt"] = request.prompt
    _add_sampling(body, request, chat=chat, send_ignore_eos=send_ignore_eos)
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _add_sampling(
    body: dict[str, Any], request: GenerationRequest, *, chat: bool, send_ignore_eos: bool
) -> None:
    s = request.sampling
    if request.max_tokens_explicit:
        body["max_tokens"] = s.max_tokens
    body["temperature"] = s.temperature
    if s.top_p != 1.0:
        body["top_p"] = s.top_p
    if s.top_k:
        body["top_k"] = s.top_k
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.n != 1:
        body["n"] = s.n
    if s.presence_penalty:
        body["presence_penalty"] = s.presence_penalty
    if s.frequency_penalty:
        body["frequency_penalty"] = s.frequency_penalty
    if s.logprobs is not None:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = s.logprobs
        else:
            body["logprobs"] = s.logprobs
    if s.ignore_eos and send_ignore_eos:
        body["ignore_eos"] = True
    if request.user is not None:
        body["user"] = request.user


def estimate_prompt_tokens(request: GenerationRequest) -> int:
    """A rough prompt size (~4 characters a token, plus a few per chat message) for
    upstreams that report no usage. Only used when the upstream's own count is missing."""
    if request.kind is RequestKind.CHAT:
        chars = sum(len(m.content) for m in request.messages)
        return (chars + 3) // 4 + 4 * len(request.messages)
    return (len(request.prompt) + 3) // 4
