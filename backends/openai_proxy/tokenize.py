"""Relay ``/tokenize`` and ``/detokenize`` to an upstream in vLLM's shapes (served at its
server root). Pure functions; retries, the breaker and concurrency slots stay in
``OpenAIProxyBackend``.

A chat is sent as its messages (and tools), in the same wire form as a chat completion,
for the upstream to render with its own template.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import GenerationRequest, RequestKind, SamplingParams, UpstreamBadResponse
from backends.openai_proxy.payload import request_body
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"


def tokenize_body(request: TokenizeRequest, upstream_model: str) -> bytes:
    body: dict[str, Any] = {
        "model": upstream_model,
        "add_special_tokens": request.add_special_tokens,
        "return_token_strs": request.return_token_strs,
    }
    if request.messages:
        chat = GenerationRequest(
            request_id=request.request_id,
            model=upstream_model,
            kind=RequestKind.CHAT,
            sampling=SamplingParams(),
            messages=request.messages,
            tools=request.tools,
        )
        wire = request_body(chat, upstream_model, stream=False, send_ignore_eos=False)
        body["messages"] = wire["messages"]
        if "tools" in wire:
            body["tools"] = wire["tools"]
        body["add_generation_prompt"] = request.add_generation_prompt
        body["continue_final_message"] = request.continue_final_message
    else:
        body["prompt"] = request.prompt
    return orjson.dumps(body)


def detokenize_body(request: DetokenizeRequest, upstream_model: str) -> bytes:
    return orjson.dumps({"model": upstream_model, "tokens": request.tokens})


def parse_tokenize(payload: Any, fallback_len: int | None) -> TokenizeResult:
    """The upstream's answer; ``fallback_len`` stands in for a missing ``max_model_len``."""
    try:
        tokens = tuple(int(token) for token in payload["tokens"])
        length = payload.get("max_model_len", fallback_len)
        strs = payload.get("token_strs")
        return TokenizeResult(
            tokens,
            int(length) if length is not None else 0,
            tuple(str(s) for s in strs) if isinstance(strs, list) else None,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UpstreamBadResponse("upstream /tokenize answer has no usable tokens") from None


def parse_detokenize(payload: Any) -> str:
    prompt = payload.get("prompt") if isinstance(payload, dict) else None
    if not isinstance(prompt, str):
        raise UpstreamBadResponse("upstream /detokenize answer has no prompt")
    return prompt
