"""Wire requests → backend ``GenerationRequest``: the one place that reads wire fields.

Everything the backend contract cannot express is refused here with a 400 naming the
``param``, so a client never gets silently different behaviour.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from backends.base import (
    ChatMessage,
    GenerationRequest,
    InvalidRequest,
    RequestKind,
    SamplingParams,
)
from gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ContentPart,
    SamplingFields,
    WireMessage,
)

log = logging.getLogger(__name__)

# Without a client limit a backend caps generation at the model's context instead.
UNSET_MAX_TOKENS = 1 << 20
_SUPPORTED_ROLES = {"system", "user", "assistant", "developer"}
# A list of prompts fans out into one backend request per prompt; bound the fan-out.
MAX_PROMPTS = 64
MAX_CHOICES = 128


def chat_request(wire: ChatCompletionRequest, request_id: str, arrival: float) -> GenerationRequest:
    _refuse_unsupported_chat(wire)
    if wire.top_logprobs is not None and not wire.logprobs:
        raise InvalidRequest("top_logprobs requires logprobs to be true", param="top_logprobs")
    limit = wire.max_completion_tokens or wire.max_tokens
    logprobs = (wire.top_logprobs or 0) if wire.logprobs else None
    return GenerationRequest(
        request_id=request_id,
        model=wire.model,
        kind=RequestKind.CHAT,
        sampling=_sampling(wire, limit, logprobs),
        messages=tuple(_message(index, message) for index, message in enumerate(wire.messages)),
        max_tokens_explicit=limit is not None,
        arrival_time=arrival,
        user=wire.user,
    )


def completion_request(
    wire: CompletionRequest, request_id: str, arrival: float
) -> GenerationRequest:
    """The request for the first prompt; ``gateway.completions`` fans a list of prompts
    out from it. With ``best_of`` above ``n`` it asks for ``best_of`` choices and for
    their log-probabilities, which the ranking needs."""
    best_of = _best_of(wire)
    if wire.echo and wire.logprobs is not None:
        raise InvalidRequest("echo together with logprobs is not supported", param="echo")
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
        max_tokens_explicit=wire.max_tokens is not None,
        arrival_time=arrival,
        user=wire.user,
        suffix=wire.suffix,
    )


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


def _sampling(wire: SamplingFields, limit: int | None, logprobs: int | None) -> SamplingParams:
    if wire.logit_bias:
        raise InvalidRequest("logit_bias is not supported", param="logit_bias")
    if wire.stream_options is not None and not wire.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true", param="stream_options"
        )
    stop = (wire.stop,) if isinstance(wire.stop, str) else tuple(wire.stop or ())
    return SamplingParams(
        max_tokens=limit if limit is not None else UNSET_MAX_TOKENS,
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
    if wire.tools or wire.functions:
        raise InvalidRequest(
            "tools are not supported", param="tools" if wire.tools else "functions"
        )
    if wire.tool_choice not in (None, "none"):
        raise InvalidRequest("tool_choice is not supported", param="tool_choice")
    if wire.function_call not in (None, "none"):
        raise InvalidRequest("function_call is not supported", param="function_call")
    if wire.response_format and wire.response_format.get("type", "text") != "text":
        raise InvalidRequest(
            "only response_format type 'text' is supported", param="response_format"
        )
    if wire.audio is not None or (wire.modalities and set(wire.modalities) != {"text"}):
        raise InvalidRequest("only text output is supported", param="modalities")


def _message(index: int, message: WireMessage) -> ChatMessage:
    where = f"messages[{index}]"
    if message.role not in _SUPPORTED_ROLES:
        raise InvalidRequest(
            f"role {message.role!r} is not supported (tools are not supported)",
            param=f"{where}.role",
        )
    content = message.content
    if content is None:
        raise InvalidRequest("content must be a string or a list of text parts", param=where)
    if isinstance(content, str):
        text = content
    else:
        parts: list[str] = []
        for part_index, part in enumerate(content):
            if isinstance(part, ContentPart):
                reason = (
                    "a text part needs a 'text' string"
                    if part.type == "text"
                    else f"content part type {part.type!r} is not supported; only 'text'"
                )
                raise InvalidRequest(reason, param=f"{where}.content[{part_index}]")
            if part.type != "text":
                raise InvalidRequest(
                    f"content part type {part.type!r} is not supported; only 'text'",
                    param=f"{where}.content[{part_index}]",
                )
            parts.append(part.text)
        text = "\n".join(parts)
    return ChatMessage(role=message.role, content=text)  # type: ignore[arg-type]
