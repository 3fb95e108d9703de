"""Wire requests → backend ``GenerationRequest``: the one place that reads wire fields.

Everything the backend contract cannot express is refused here with a 400 naming the
``param``, so a client never gets silently different behaviour.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import orjson

from backends.base import (
    ChatMessage,
    ContentPart,
    GenerationRequest,
    InvalidRequest,
    ReasoningControls,
    ReasoningEffort,
    RequestKind,
    SamplingParams,
)
from gateway.api import tool_wire
from gateway.api.wire import (
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    TextPart,
    WireMessage,
)

log = logging.getLogger(__name__)

_SUPPORTED_ROLES = {"system", "user", "assistant", "developer", "tool", "function"}
# A list of prompts fans out into one backend request per prompt; bound the fan-out.
MAX_PROMPTS = 64
MAX_CHOICES = 128


def chat_request(wire: ChatCompletionRequest, request_id: str, arrival: float) -> GenerationRequest:
    _refuse_unsupported_chat(wire)
    if wire.top_logprobs is not None and not wire.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    limit = wire.max_completion_tokens or wire.max_tokens
    logprobs = (wire.top_logprobs or 0) if wire.logprobs else None
    specs = tool_wire.tools(wire)
    return GenerationRequest(
        request_id=request_id,
        model=wire.model,
        kind=RequestKind.CHAT,
        sampling=_sampling(wire, limit, logprobs),
        messages=tuple(_message(index, wire.messages) for index in range(len(wire.messages))),
        arrival_time=arrival,
        user=wire.user,
        asked_priority=wire.priority,
        tools=specs,
        tool_choice=tool_wire.tool_choice(wire, specs),
        # Legacy `functions` answer with one `function_call`: ask for one call.
        parallel_tool_calls=False if wire.functions else wire.parallel_tool_calls,
        response_format=tool_wire.response_format(wire),
        logit_bias=_logit_bias(wire),
        passthrough=_passthrough(wire),
        reasoning=reasoning_controls(
            wire.reasoning_effort, wire.chat_template_kwargs, wire.thinking_token_budget
        ),
    )


def reasoning_controls(
    effort: ReasoningEffort | None,
    template_kwargs: dict[str, Any] | None = None,
    budget_tokens: int | None = None,
) -> ReasoningControls:
    """The typed controls of a chat request (Responses and Messages build theirs from
    their own fields): ``reasoning_effort: none`` and a boolean ``enable_thinking`` (or
    Granite's ``thinking``) in ``chat_template_kwargs`` switch the thought."""
    thinking: bool | None = False if effort == "none" else None
    for switch in ("enable_thinking", "thinking"):
        value = (template_kwargs or {}).get(switch)
        if isinstance(value, bool) and thinking is None:
            thinking = value
    return ReasoningControls(
        effort=effort,
        thinking=thinking,
        budget_tokens=budget_tokens,
        template_kwargs=orjson.dumps(template_kwargs).decode() if template_kwargs else "",
    )


def completion_request(
    wire: CompletionRequest, request_id: str, arrival: float
) -> GenerationRequest:
    """The request for the first prompt; ``gateway.api.completions`` fans a list of prompts
    out from it. With ``best_of`` above ``n`` it asks for ``best_of`` choices and for
    their log-probabilities, which the ranking needs."""
    best_of = _best_of(wire)
    scored = prompt_scoring(wire)
    logprobs = wire.logprobs if wire.logprobs is not None or best_of == wire.n else 0
    sampling = replace(_sampling(wire, wire.max_tokens, logprobs), n=best_of)
    first = completion_prompts(wire.prompt)[0]
    return GenerationRequest(
        request_id=request_id,
        model=wire.model,
        kind=RequestKind.COMPLETION,
        sampling=sampling,
        prompt=first if isinstance(first, str) else "",
        prompt_token_ids=() if isinstance(first, str) else first,
        arrival_time=arrival,
        user=wire.user,
        asked_priority=wire.priority,
        suffix=wire.suffix,
        logit_bias=_logit_bias(wire),
        passthrough=_passthrough(wire),
        prompt_logprobs=scored,
    )


def prompt_scoring(wire: CompletionRequest) -> int | None:
    """How many alternatives each prompt token is scored with (``None``: not scored):
    ``echo`` with ``logprobs`` scores the echoed prompt as OpenAI's legacy API and vLLM
    do; vLLM's ``prompt_logprobs`` asks for it without echo (never streamed, as vLLM)."""
    asked = [wire.prompt_logprobs] if wire.prompt_logprobs is not None else []
    if wire.echo and wire.logprobs is not None:
        asked.append(wire.logprobs)
    if wire.prompt_logprobs is not None and wire.stream:
        raise InvalidRequest("prompt_logprobs cannot be streamed", param="prompt_logprobs")
    if wire.max_tokens == 0 and not asked:
        raise InvalidRequest(
            "max_tokens may be 0 only when the prompt is scored (echo with logprobs, or "
            "prompt_logprobs)",
            param="max_tokens",
        )
    return max(asked) if asked else None


def completion_prompts(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> tuple[str | tuple[int, ...], ...]:
    """Each prompt of a completions request: a text or a token-id tuple, in order."""
    if isinstance(prompt, str):
        return (prompt,)
    if not prompt:
        raise InvalidRequest("prompt must not be an empty list", param="prompt")
    if isinstance(prompt[0], int):
        items: list[str | list[int]] = [prompt]  # type: ignore[list-item]
    else:
        items = list(prompt)  # type: ignore[arg-type]
    if len(items) > MAX_PROMPTS:
        raise InvalidRequest(f"prompt holds more than {MAX_PROMPTS} prompts", param="prompt")
    out: list[str | tuple[int, ...]] = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            out.append(item)
            continue
        if not item or min(item) < 0:
            raise InvalidRequest(
                "a token-id prompt must be a non-empty list of ids >= 0", param=f"prompt[{index}]"
            )
        out.append(tuple(item))
    return tuple(out)


def _best_of(wire: CompletionRequest) -> int:
    best_of = wire.n if wire.best_of is None else wire.best_of
    if best_of < wire.n:
        raise InvalidRequest("best_of must be greater than or equal to n", param="best_of")
    if best_of > MAX_CHOICES:
        raise InvalidRequest(f"best_of must be at most {MAX_CHOICES}", param="best_of")
    if best_of > wire.n and wire.stream:
        raise InvalidRequest("best_of above n cannot be streamed", param="best_of")
    return best_of


def report_unknown_fields(wire: SamplingFields, request_id: str) -> None:
    unknown = wire.unknown_fields()
    if unknown and log.isEnabledFor(logging.DEBUG):
        log.debug("request %s: ignoring unknown fields %s", request_id, ", ".join(unknown))


def _logit_bias(wire: SamplingFields) -> tuple[tuple[str, float], ...]:
    pairs = tuple((wire.logit_bias or {}).items())
    for token, bias in pairs:
        if not token.isdigit() or not -100.0 <= bias <= 100.0:
            raise InvalidRequest(
                "logit_bias maps token ids to biases between -100 and 100", param="logit_bias"
            )
    return pairs


def _passthrough(wire: SamplingFields) -> str:
    extra = wire.model_extra
    return orjson.dumps(extra).decode() if extra else ""


def _sampling(wire: SamplingFields, limit: int | None, logprobs: int | None) -> SamplingParams:
    if wire.stream_options is not None and not wire.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    stop = (wire.stop,) if isinstance(wire.stop, str) else tuple(wire.stop or ())
    return SamplingParams(
        max_tokens=limit,
        temperature=1.0 if wire.temperature is None else wire.temperature,
        top_p=1.0 if wire.top_p is None else wire.top_p,
        top_k=max(0, wire.top_k or 0),
        seed=wire.seed,
        stop=stop,
        presence_penalty=wire.presence_penalty,
        frequency_penalty=wire.frequency_penalty,
        n=wire.n,
        logprobs=logprobs,
        ignore_eos=wire.ignore_eos,
    )


def _refuse_unsupported_chat(wire: ChatCompletionRequest) -> None:
    if wire.audio is not None or (wire.modalities and set(wire.modalities) != {"text"}):
        raise InvalidRequest("only text output is supported", param="modalities")


def _message(index: int, messages: list[WireMessage]) -> ChatMessage:
    message = messages[index]
    where = f"messages[{index}]"
    if message.role not in _SUPPORTED_ROLES:
        raise InvalidRequest(f"role {message.role!r} is not supported", param=f"{where}.role")
    calls = tool_wire.assistant_calls(index, message) if message.role == "assistant" else ()
    if message.content is None and not calls:
        raise InvalidRequest("content must be a string or a list of content parts", param=where)
    text, parts = _content(where, message)
    if message.role == "function":  # legacy: the answer to the last function_call
        call_id = tool_wire.legacy_function_call_id(messages, index)
        return ChatMessage("tool", text, tool_call_id=call_id, name=message.name, parts=parts)
    if message.role == "tool" and not message.tool_call_id:
        raise InvalidRequest("a tool message needs tool_call_id", param=f"{where}.tool_call_id")
    thought = message.reasoning_content or message.reasoning or ""
    return ChatMessage(
        role=message.role,  # type: ignore[arg-type]
        content=text,
        tool_calls=calls,
        tool_call_id=message.tool_call_id if message.role == "tool" else None,
        name=message.name,
        parts=parts,
        reasoning=thought if message.role == "assistant" else "",
    )


def _content(where: str, message: WireMessage) -> tuple[str, tuple[ContentPart, ...]]:
    """The text of a message, and every part as sent when any part is not text."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or "", ()
    texts: list[str] = []
    for part_index, part in enumerate(content):
        if part.type == "text":
            if not isinstance(part, TextPart):
                raise InvalidRequest(
                    "a text part needs a 'text' string", param=f"{where}.content[{part_index}]"
                )
            texts.append(part.text)
    raw: tuple[ContentPart, ...] = ()
    if any(part.type != "text" for part in content):
        raw = tuple(
            ContentPart(part.type, orjson.dumps(part.model_dump()).decode()) for part in content
        )
    return "\n".join(texts), raw
