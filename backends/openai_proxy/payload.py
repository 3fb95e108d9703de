"""Build the upstream request body from a ``GenerationRequest``. Pure functions.

The body always streams with ``stream_options.include_usage`` so token counts come back
from engines that support it; optional fields are sent only when they differ from the
OpenAI defaults, so strict servers see a minimal body; ``max_tokens`` is the effective
limit (``backends.base.effective_max_tokens``: the client's, else the model's
``default_max_tokens``, else none, so the upstream's own applies). Tools, tool choice, response
format, logit_bias, content parts and the wire fields the contract does not model
(``GenerationRequest.passthrough``) are forwarded as the client sent them. The request's
``priority`` (as the front door resolved it, never the client's raw field) only to an
upstream that schedules by it (``EngineProfile.sends_priority``).

Reasoning controls become vLLM's fields: ``reasoning_effort`` as sent (vLLM 0.32 takes
OpenAI's whole list, ``none`` to ``max``), the switch as
``chat_template_kwargs.enable_thinking`` (Qwen3's variable; vLLM hands a template only
the variables it reads) next to the client's own ``chat_template_kwargs``, and the budget
as ``thinking_token_budget``. An earlier assistant turn's thought goes back as its
``reasoning`` (the name vLLM 0.32 reads) and ``reasoning_content`` (DeepSeek's, which
llama.cpp reads), for templates that keep it.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import (
    ChatMessage,
    GenerationRequest,
    ReasoningControls,
    RequestKind,
    ResponseFormat,
    ToolSpec,
    effective_max_tokens,
)
from backends.openai_proxy.engines import EngineProfile

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"


def build_body(
    request: GenerationRequest,
    upstream_model: str,
    profile: EngineProfile,
    *,
    default_max_tokens: int | None = None,
) -> tuple[str, bytes]:
    """``(path under the API root, JSON body)`` for one request."""
    chat = request.kind is RequestKind.CHAT
    body = engine_body(request, upstream_model, profile, default_max_tokens=default_max_tokens)
    return (CHAT_PATH if chat else COMPLETIONS_PATH), orjson.dumps(body)


def engine_body(
    request: GenerationRequest,
    upstream_model: str,
    profile: EngineProfile,
    *,
    default_max_tokens: int | None = None,
) -> dict[str, Any]:
    """The streaming body for ``request`` as the engine of ``profile`` takes it."""
    body = request_body(
        request,
        upstream_model,
        stream=True,
        send_ignore_eos=profile.accepts_ignore_eos,
        default_max_tokens=default_max_tokens,
    )
    for key, value in profile.body_defaults:
        body.setdefault(key, value)
    if profile.sends_priority and request.priority:
        body["priority"] = request.priority
    return body


def request_body(
    request: GenerationRequest,
    model: str,
    *,
    stream: bool,
    send_ignore_eos: bool,
    default_max_tokens: int | None = None,
) -> dict[str, Any]:
    """The OpenAI request body for ``request`` (the proxy's and the benchmark client's)."""
    body: dict[str, Any] = {"model": model}
    chat = request.kind is RequestKind.CHAT
    if chat:
        body["messages"] = [_message(m) for m in request.messages]
        _add_tools(body, request)
        _add_reasoning(body, request.reasoning)
    else:
        body["prompt"] = list(request.prompt_token_ids) or request.prompt
        if request.suffix is not None:
            body["suffix"] = request.suffix
    limit = effective_max_tokens(request.sampling.max_tokens, default_max_tokens, None)
    _add_sampling(body, request, limit, chat=chat, send_ignore_eos=send_ignore_eos)
    if request.logit_bias:
        body["logit_bias"] = dict(request.logit_bias)
    if request.passthrough:
        for key, value in orjson.loads(request.passthrough).items():
            body.setdefault(key, value)
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _message(message: ChatMessage) -> dict[str, Any]:
    content: Any = message.content
    if message.parts:
        content = [orjson.loads(part.json) for part in message.parts]
    elif message.tool_calls and not content:
        content = None  # as OpenAI sends a turn that only calls tools
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning:
        out["reasoning"] = out["reasoning_content"] = message.reasoning
    return out


def _add_reasoning(body: dict[str, Any], controls: ReasoningControls) -> None:
    if not controls.asked:
        return
    if controls.effort is not None:
        body["reasoning_effort"] = controls.effort
    kwargs: dict[str, Any] = (
        orjson.loads(controls.template_kwargs) if controls.template_kwargs else {}
    )
    if controls.thinking is not None:
        kwargs.setdefault("enable_thinking", controls.thinking)
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if controls.budget_tokens is not None:
        body["thinking_token_budget"] = controls.budget_tokens


def _add_tools(body: dict[str, Any], request: GenerationRequest) -> None:
    if request.tools:
        body["tools"] = [_tool(tool) for tool in request.tools]
    choice = request.tool_choice
    if choice is not None:
        body["tool_choice"] = (
            {"type": "function", "function": {"name": choice.name}}
            if choice.mode == "named"
            else choice.mode
        )
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.response_format.type != "text":
        body["response_format"] = _response_format(request.response_format)


def _tool(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _response_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "json_object" and fmt.schema is not None:
        # llama.cpp's convention; vLLM and OpenAI only know a schema as json_schema.
        return {
            "type": "json_schema",
            "json_schema": {"name": "schema", "schema": fmt.schema},
        }
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    schema = fmt.schema if fmt.schema is not None else {}
    spec: dict[str, Any] = {"name": fmt.name, "schema": schema}
    if fmt.description is not None:
        spec["description"] = fmt.description
    if fmt.strict is not None:
        spec["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": spec}


def _add_sampling(
    body: dict[str, Any],
    request: GenerationRequest,
    limit: int | None,
    *,
    chat: bool,
    send_ignore_eos: bool,
) -> None:
    s = request.sampling
    if limit is not None:
        body["max_tokens"] = limit
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
    return len(request.prompt_token_ids) or (len(request.prompt) + 3) // 4
