"""``ResponsesRequest`` → the backend's ``GenerationRequest``: the same contract as chat.

The conversation is a list of Responses *items* (messages, ``function_call``,
``function_call_output``, ``reasoning``); each becomes one ``ChatMessage``, consecutive
function calls folding into one assistant turn as chat expresses them, and a reasoning
item's thought riding on the assistant turn after it (a thought with no assistant turn
after it is dropped). A reasoning item's ``encrypted_content`` is opened and checked
(``gateway.api.thought_seal``) when the client sent it; history kept by the gateway
(``previous_response_id``) is read from its ``content``. Everything the contract cannot
express is refused with a 400 naming the ``param`` in the Responses request's notation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar, cast

from pydantic import BaseModel, ValidationError

from backends.base import (
    TEXT_FORMAT,
    ChatMessage,
    GenerationRequest,
    InvalidRequest,
    ReasoningControls,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from gateway.api.responses.wire import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolParam,
    InputTextPart,
    JsonSchemaFormat,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
)
from gateway.api.thought_seal import ThoughtSeal
from gateway.api.tool_wire import checked_schema
from gateway.errors import from_validation_error

Item = dict[str, Any]
_ModelT = TypeVar("_ModelT", bound=BaseModel)


def input_items(wire: ResponsesRequest) -> list[Item]:
    """This request's own items, a plain string input being one user message."""
    if wire.input is None:
        return []
    if isinstance(wire.input, str):
        return [{"type": "message", "role": "user", "content": wire.input}]
    return list(wire.input)


def generation_request(
    wire: ResponsesRequest,
    conversation: Sequence[Item],
    offset: int,
    request_id: str,
    arrival: float,
    *,
    seal: ThoughtSeal,
) -> GenerationRequest:
    """``conversation`` is the stored history followed by this request's items; the
    latter start at ``offset``, so errors name them as ``input[i]``."""
    refuse_unsupported(wire)
    messages: list[ChatMessage] = []
    if wire.instructions:
        messages.append(ChatMessage(role="system", content=wire.instructions))
    messages.extend(chat_messages(conversation, offset, seal))
    if not any(message.role != "system" for message in messages):
        raise InvalidRequest("input must contain at least one item", param="input")
    tools = tool_specs(wire.tools or [])
    return GenerationRequest(
        request_id=request_id,
        model=wire.model,
        kind=RequestKind.CHAT,
        sampling=SamplingParams(
            max_tokens=wire.max_output_tokens,
            temperature=1.0 if wire.temperature is None else wire.temperature,
            top_p=1.0 if wire.top_p is None else wire.top_p,
            logprobs=logprobs_of(wire),
        ),
        messages=tuple(messages),
        arrival_time=arrival,
        user=wire.user or wire.safety_identifier,
        tools=tools,
        tool_choice=tool_choice(wire.tool_choice, tools),
        parallel_tool_calls=wire.parallel_tool_calls,
        response_format=response_format(wire),
        reasoning=reasoning_controls(wire),
    )


def reasoning_controls(wire: ResponsesRequest) -> ReasoningControls:
    """``reasoning.effort``; ``none`` switches the thought off."""
    effort = wire.reasoning.effort if wire.reasoning is not None else None
    return ReasoningControls(effort=effort, thinking=False if effort == "none" else None)


_CHAT_PARAMS = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "logprobs": "top_logprobs",
    "reasoning_effort": "reasoning.effort",
    "chat_template_kwargs": "reasoning.effort",
    "thinking_token_budget": "reasoning",
}


def wire_param(param: str) -> str:
    """A chat-notation ``param`` (from routing or a backend) in this API's names; a
    message index does not map onto one input item (instructions, history, folded
    calls), so it names ``input`` as a whole."""
    head = param.split(".", 1)[0].split("[", 1)[0]
    if head in ("messages", "prompt"):
        return "input"
    return _CHAT_PARAMS.get(head, param)


LOGPROBS_INCLUDE = "message.output_text.logprobs"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
_INCLUDES = {LOGPROBS_INCLUDE, ENCRYPTED_INCLUDE}
_INCLUDE_REFUSAL = f"only {LOGPROBS_INCLUDE!r} and {ENCRYPTED_INCLUDE!r} can be included"


def logprobs_of(wire: ResponsesRequest) -> int | None:
    """``None`` when off, else how many alternatives to return next to each token."""
    if LOGPROBS_INCLUDE in (wire.include or ()) or wire.top_logprobs:
        return wire.top_logprobs or 0
    return None


def refuse_unsupported(wire: ResponsesRequest) -> None:
    refusals: list[tuple[bool, str, str]] = [
        (bool(wire.background), "background", "background responses are not supported"),
        (bool(set(wire.include or ()) - _INCLUDES), "include", _INCLUDE_REFUSAL),
        (wire.truncation == "auto", "truncation", "only truncation 'disabled' is supported"),
        (wire.conversation is not None, "conversation", "conversations are not supported"),
        (wire.prompt is not None, "prompt", "prompt templates are not supported"),
        (bool(wire.context_management), "context_management", "not supported"),
    ]
    for refused, param, message in refusals:
        if refused:
            raise InvalidRequest(message, param=param)


def chat_messages(
    items: Sequence[Item], offset: int = 0, seal: ThoughtSeal | None = None
) -> list[ChatMessage]:
    """One ``ChatMessage`` per item; a run of ``function_call`` items is one assistant
    turn (appended to the assistant message right before it, as chat does); a reasoning
    item's thought goes on the assistant turn that follows it."""
    messages: list[ChatMessage] = []
    thought: list[str] = []
    for position, item in enumerate(items):
        where = f"input[{position - offset}]" if position >= offset else "previous_response_id"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "reasoning":
            thought.append(
                _thought(_parse(ReasoningItem, item, where), where, seal, position >= offset)
            )
            continue
        if kind == "message":
            message = _message(_parse(MessageItem, item, where), where)
            if message.role == "assistant" and thought:
                message = replace(message, reasoning="".join(thought))
            thought.clear()
            messages.append(message)
        elif kind == "function_call":
            call = _parse(FunctionCallItem, item, where)
            _append_call(
                messages,
                ToolCall(id=call.call_id, name=call.name, arguments=call.arguments),
                "".join(thought),
            )
            thought.clear()
        elif kind == "function_call_output":
            result = _parse(FunctionCallOutputItem, item, where)
            output = (
                result.output
                if isinstance(result.output, str)
                else _text_of(result.output, f"{where}.output")
            )
            messages.append(ChatMessage(role="tool", content=output, tool_call_id=result.call_id))
            thought.clear()
        else:
            raise InvalidRequest(
                f"input item type {kind!r} is not supported; use message, function_call, "
                "function_call_output or reasoning",
                param=f"{where}.type",
            )
    return messages


def _thought(item: ReasoningItem, where: str, seal: ThoughtSeal | None, sent: bool) -> str:
    """A reasoning item's thought: sealed, as the client sent it (checked: a forged one
    is refused), else its text (kept history is read from its text, which the gateway
    wrote: its seal may be another process's)."""
    parts = item.content if item.content is not None else item.summary
    if item.encrypted_content is not None and (sent or not parts):
        if seal is None:
            raise InvalidRequest("encrypted_content cannot be read here", param=where)
        return seal.open(item.encrypted_content, f"{where}.encrypted_content")
    return "".join(part.text for part in parts)


def _append_call(messages: list[ChatMessage], call: ToolCall, thought: str) -> None:
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        messages[-1] = replace(
            last, tool_calls=(*last.tool_calls, call), reasoning=last.reasoning + thought
        )
    else:
        messages.append(
            ChatMessage(role="assistant", content="", tool_calls=(call,), reasoning=thought)
        )


def _message(item: MessageItem, where: str) -> ChatMessage:
    if isinstance(item.content, str):
        return ChatMessage(role=item.role, content=item.content)
    return ChatMessage(role=item.role, content=_text_of(item.content, f"{where}.content"))


def _text_of(parts: list[dict[str, Any]], where: str) -> str:
    """The text of ``input_text`` / ``output_text`` parts (either, in any role: clients
    replay output items as input); any other part is refused."""
    texts: list[str] = []
    for index, raw in enumerate(parts):
        if not _is_text(raw):
            kind = raw.get("type") if isinstance(raw, dict) else None
            raise InvalidRequest(
                f"content part type {kind!r} is not supported; only input_text/output_text",
                param=f"{where}[{index}]",
            )
        texts.append(_parse(InputTextPart, raw, f"{where}[{index}]").text)
    return "".join(texts)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_text(raw: Any) -> bool:
    return isinstance(raw, dict) and raw.get("type") in ("input_text", "output_text")


def tool_specs(tools: list[dict[str, Any]]) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for index, raw in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(raw, dict) or raw.get("type") != "function":
            kind = raw.get("type") if isinstance(raw, dict) else None
            raise InvalidRequest(
                f"tool type {kind!r} is not supported; only 'function' tools",
                param=f"{where}.type",
            )
        tool = _parse(FunctionToolParam, raw, where)
        spec = ToolSpec(name=tool.name, description=tool.description, strict=tool.strict)
        if tool.parameters is not None:
            schema = checked_schema(tool.parameters, f"{where}.parameters")
            spec = ToolSpec(tool.name, tool.description, schema, tool.strict)
        specs.append(spec)
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidRequest("tool names must be unique", param="tools")
    return tuple(specs)


def tool_choice(raw: str | dict[str, Any] | None, specs: Sequence[ToolSpec]) -> ToolChoice | None:
    if raw is None:
        return None
    if raw in ("none", "auto", "required"):
        choice = ToolChoice(cast(Literal["none", "auto", "required"], raw))
    elif (
        isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("name"), str)
    ):
        choice = ToolChoice("named", raw["name"])
    else:
        raise InvalidRequest(
            "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
            param="tool_choice",
        )
    if choice.mode != "none" and not specs:
        raise InvalidRequest(
            "tool_choice is only allowed when tools are specified", param="tool_choice"
        )
    if choice.mode == "named" and choice.name not in {spec.name for spec in specs}:
        raise InvalidRequest(
            f"tool_choice names an unknown function {choice.name!r}", param="tool_choice"
        )
    return choice


def response_format(wire: ResponsesRequest) -> ResponseFormat:
    raw = wire.text.format if wire.text is not None else None
    kind = raw.get("type") if raw is not None else "text"
    if raw is None or kind == "text":
        return TEXT_FORMAT
    if kind == "json_object":
        return ResponseFormat("json_object")
    if kind == "json_schema":
        spec = _parse(JsonSchemaFormat, raw, "text.format")
        return ResponseFormat(
            "json_schema",
            name=spec.name,
            schema=checked_schema(spec.schema_, "text.format.schema"),
            strict=spec.strict,
            description=spec.description,
        )
    raise InvalidRequest(
        f"text.format type {kind!r} is not supported; use text, json_object or json_schema",
        param="text.format.type",
    )


def _parse(model: type[_ModelT], raw: Any, where: str) -> _ModelT:
    if not isinstance(raw, dict):
        raise InvalidRequest("must be an object", param=where)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        inner = from_validation_error(exc)
        param = f"{where}.{inner.param}" if inner.param else where
        raise InvalidRequest(inner.message.split(": ", 1)[-1], param=param) from None
