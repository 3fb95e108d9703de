"""A Messages request → the backend's ``GenerationRequest``: the same contract as chat.

``system`` becomes the system message; each Anthropic message becomes one chat message,
except that a user turn's ``tool_result`` blocks become ``tool`` messages (before the
turn's other content, where Anthropic requires them) and an assistant turn's
``tool_use`` blocks become its ``tool_calls`` and its ``thinking`` blocks its reasoning
(their seals checked: ``gateway.api.thought_seal``). ``thinking`` becomes the reasoning
controls (``enabled`` with its ``budget_tokens``, below ``max_tokens``; ``adaptive`` and
``between_tools`` as enabled with no budget; ``disabled``). Image blocks become chat ``image_url``
parts, so a backend without image input refuses them by its declared features
(``gateway.service.capabilities``), like any other request; the ``ParamMap`` then names
the block in this API's notation. Everything else the contract cannot express is refused
here with a 400 naming the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from backends.base import (
    ChatMessage,
    ContentPart,
    GenerationRequest,
    InvalidRequest,
    ReasoningControls,
    RequestKind,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from gateway.api.messages.wire import CountTokensRequest, MessagesRequest, WireMessage
from gateway.api.thought_seal import ThoughtSeal
from gateway.api.tool_wire import function_spec

MAX_STOP_SEQUENCES = 16
_CHAT_PARAM = re.compile(r"^messages\[(\d+)\](?:\.content\[(\d+)\])?")
_RENAMED = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "user": "metadata.user_id",
    "prompt": "messages",
    "chat_template_kwargs": "thinking.type",
    "thinking_token_budget": "thinking.budget_tokens",
}


@dataclass(slots=True)
class ParamMap:
    """Where each chat message (and content part) came from in the Messages request, so
    an error raised in chat notation (by a backend or the feature check) names the
    client's own field. One per request, filled while translating."""

    origins: list[str] = field(default_factory=list)  # by chat message index
    parts: dict[tuple[int, int], str] = field(default_factory=dict)

    def __call__(self, param: str) -> str:
        found = _CHAT_PARAM.match(param)
        if found is None:
            head = param.split(".", 1)[0].split("[", 1)[0]
            return _RENAMED.get(head, param)
        index = int(found.group(1))
        if index >= len(self.origins):
            return "messages"
        if found.group(2) is not None:
            part = self.parts.get((index, int(found.group(2))))
            if part is not None:
                return part
        return self.origins[index]


def messages_request(
    wire: MessagesRequest, request_id: str, arrival: float, seal: ThoughtSeal
) -> tuple[GenerationRequest, ParamMap]:
    stop = tuple(wire.stop_sequences or ())
    if len(stop) > MAX_STOP_SEQUENCES or any(not item for item in stop):
        raise InvalidRequest(
            f"at most {MAX_STOP_SEQUENCES} non-empty stop sequences", param="stop_sequences"
        )
    sampling = SamplingParams(
        max_tokens=wire.max_tokens,
        temperature=1.0 if wire.temperature is None else wire.temperature,
        top_p=1.0 if wire.top_p is None else wire.top_p,
        top_k=wire.top_k or 0,
        stop=stop,
    )
    if wire.container is not None:
        raise InvalidRequest("containers are not supported", param="container")
    request, params = prompt_request(wire, sampling, request_id, arrival, seal)
    budget = request.reasoning.budget_tokens
    if budget is not None and budget >= wire.max_tokens:
        raise InvalidRequest(
            f"thinking.budget_tokens ({budget}) must be less than max_tokens "
            f"({wire.max_tokens}): max_tokens counts the thought and the answer",
            param="thinking.budget_tokens",
        )
    user = wire.metadata.user_id if wire.metadata is not None else None
    return replace(request, user=user), params


def prompt_request(
    wire: CountTokensRequest,
    sampling: SamplingParams,
    request_id: str,
    arrival: float,
    seal: ThoughtSeal,
) -> tuple[GenerationRequest, ParamMap]:
    """The request without its output controls: what ``count_tokens`` counts too."""
    refuse_unsupported(wire)
    params = ParamMap()
    messages: list[ChatMessage] = []
    if wire.system:
        messages.append(ChatMessage(role="system", content=_system(wire.system)))
        params.origins.append("system")
    for index, message in enumerate(wire.messages):
        _append_message(messages, params, index, message, seal)
    last = wire.messages[-1]
    if last.role == "assistant":
        # The contract has no "continue this turn": answering it as a new turn would
        # silently differ from what the client asked.
        raise InvalidRequest(
            "a final assistant message (prefill) is not supported",
            param=f"messages[{len(wire.messages) - 1}]",
        )
    tools = tool_specs(wire.tools or [])
    choice, parallel = tool_choice(wire.tool_choice, tools)
    request = GenerationRequest(
        request_id=request_id,
        model=wire.model,
        kind=RequestKind.CHAT,
        sampling=sampling,
        messages=tuple(messages),
        arrival_time=arrival,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        reasoning=thinking_controls(wire.thinking),
    )
    return request, params


_THINKING_ON = ("enabled", "adaptive", "between_tools")


def thinking_controls(thinking: dict[str, Any] | None) -> ReasoningControls:
    """``thinking`` as reasoning controls (the module doc says how each type maps)."""
    if thinking is None:
        return ReasoningControls()
    kind = thinking.get("type")
    if kind == "disabled":
        return ReasoningControls(thinking=False)
    if kind not in _THINKING_ON:
        raise InvalidRequest(
            "thinking.type must be 'enabled', 'adaptive', 'between_tools' or 'disabled'",
            param="thinking.type",
        )
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        raise InvalidRequest(
            "thinking.display must be 'summarized' or 'omitted'", param="thinking.display"
        )
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (
        not isinstance(budget, int) or isinstance(budget, bool) or budget < 1
    ):
        raise InvalidRequest(
            "thinking of type 'enabled' needs budget_tokens, a positive integer "
            "(Anthropic's 1,024 minimum is not enforced)",
            param="thinking.budget_tokens",
        )
    return ReasoningControls(thinking=True, budget_tokens=budget if kind == "enabled" else None)


def thought_shown(thinking: dict[str, Any] | None) -> bool:
    """Whether thinking blocks carry the thought's text (``display: omitted``: only its
    signature, which holds it sealed for the next turn)."""
    return thinking is None or thinking.get("display") != "omitted"


def refuse_unsupported(wire: CountTokensRequest) -> None:
    refusals: list[tuple[bool, str, str]] = [
        (bool(wire.mcp_servers), "mcp_servers", "MCP servers are not supported"),
        (wire.output_config is not None, "output_config", "output_config is not supported"),
        (wire.output_format is not None, "output_format", "output_format is not supported"),
        (wire.context_management is not None, "context_management", "not supported"),
    ]
    for refused, param, message in refusals:
        if refused:
            raise InvalidRequest(message, param=param)


def _system(system: str | list[dict[str, Any]]) -> str:
    if isinstance(system, str):
        return system
    return "\n".join(_text(block, f"system[{index}]") for index, block in enumerate(system))


def _text(block: Any, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text":
        kind = block.get("type") if isinstance(block, dict) else None
        raise InvalidRequest(f"expected a text block, not {kind!r}", param=f"{where}.type")
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest("a text block needs a 'text' string", param=f"{where}.text")
    return text


def _append_message(
    messages: list[ChatMessage],
    params: ParamMap,
    index: int,
    message: WireMessage,
    seal: ThoughtSeal,
) -> None:
    where = f"messages[{index}]"
    if isinstance(message.content, str):
        messages.append(ChatMessage(role=message.role, content=message.content))
        params.origins.append(where)
        return
    if message.role == "assistant":
        messages.append(_assistant(message.content, where, seal))
        params.origins.append(where)
        return
    texts: list[str] = []
    parts: list[tuple[int, ContentPart]] = []
    for position, block in enumerate(message.content):
        at = f"{where}.content[{position}]"
        kind = block.get("type")
        if kind == "tool_result":
            messages.append(_tool_result(block, at))
            params.origins.append(at)
        elif kind == "text":
            texts.append(_text(block, at))
            parts.append((position, _text_part(texts[-1])))
        elif kind == "image":
            parts.append((position, _image_part(block, at)))
        else:
            raise InvalidRequest(
                f"content block type {kind!r} is not supported in a user message; use text, "
                "image or tool_result",
                param=f"{at}.type",
            )
    if not parts and any(block.get("type") == "tool_result" for block in message.content):
        return  # a turn of tool results only
    images = any(part.type != "text" for _, part in parts)
    chat_index = len(messages)
    for part_index, (position, _) in enumerate(parts):
        params.parts[(chat_index, part_index)] = f"{where}.content[{position}]"
    messages.append(
        ChatMessage(
            role="user",
            content="\n".join(texts),
            parts=tuple(part for _, part in parts) if images else (),
        )
    )
    params.origins.append(where)


def _assistant(blocks: list[dict[str, Any]], where: str, seal: ThoughtSeal) -> ChatMessage:
    texts: list[str] = []
    calls: list[ToolCall] = []
    thoughts: list[str] = []
    for position, block in enumerate(blocks):
        at = f"{where}.content[{position}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            calls.append(_tool_use(block, at))
        elif kind == "thinking":
            thoughts.append(_thinking(block, at, seal))
        else:
            raise InvalidRequest(
                f"content block type {kind!r} is not supported in an assistant message; "
                "use text, tool_use or thinking",
                param=f"{at}.type",
            )
    return ChatMessage(
        role="assistant",
        content="".join(texts),
        tool_calls=tuple(calls),
        reasoning="".join(thoughts),
    )


def _thinking(block: dict[str, Any], where: str, seal: ThoughtSeal) -> str:
    """A thinking block's thought, from its signature (the seal holds it); its text, when
    sent, must be the sealed one."""
    text, signature = block.get("thinking", ""), block.get("signature")
    if not isinstance(signature, str) or not signature:
        raise InvalidRequest("a thinking block needs its signature", param=f"{where}.signature")
    thought = seal.open(signature, f"{where}.signature")
    if not isinstance(text, str) or (text and text != thought):
        raise InvalidRequest(
            "the thinking text is not the one its signature holds", param=f"{where}.thinking"
        )
    return thought


def _tool_use(block: dict[str, Any], where: str) -> ToolCall:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest("a tool_use block needs a string id", param=f"{where}.id")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("a tool_use block needs a string name", param=f"{where}.name")
    if not isinstance(arguments, dict):
        raise InvalidRequest("tool_use input must be an object", param=f"{where}.input")
    return ToolCall(id=call_id, name=name, arguments=orjson.dumps(arguments).decode())


def _tool_result(block: dict[str, Any], where: str) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequest("a tool_result block needs tool_use_id", param=f"{where}.tool_use_id")
    content = block.get("content", "")
    if isinstance(content, list):
        content = "\n".join(
            _text(item, f"{where}.content[{index}]") for index, item in enumerate(content)
        )
    elif not isinstance(content, str):
        raise InvalidRequest(
            "tool_result content must be a string or text blocks", param=f"{where}.content"
        )
    return ChatMessage(role="tool", content=content, tool_call_id=call_id)


def _text_part(text: str) -> ContentPart:
    return ContentPart("text", orjson.dumps({"type": "text", "text": text}).decode())


def _image_part(block: dict[str, Any], where: str) -> ContentPart:
    """An image block as the chat ``image_url`` part a vision backend takes."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise InvalidRequest(
                "a base64 image source needs media_type and data", param=f"{where}.source"
            )
        url = f"data:{media};base64,{data}"
    elif kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise InvalidRequest(
            "an image source must be of type 'base64' or 'url'", param=f"{where}.source"
        )
    part = {"type": "image_url", "image_url": {"url": url}}
    return ContentPart("image_url", orjson.dumps(part).decode())


def tool_specs(tools: list[dict[str, Any]]) -> tuple[ToolSpec, ...]:
    specs: list[ToolSpec] = []
    for index, raw in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(raw, dict) or raw.get("type", "custom") != "custom":
            kind = raw.get("type") if isinstance(raw, dict) else None
            raise InvalidRequest(
                f"tool type {kind!r} is not supported; only client tools (custom)",
                param=f"{where}.type",
            )
        if "input_schema" not in raw:
            raise InvalidRequest("a tool needs an input_schema", param=f"{where}.input_schema")
        specs.append(function_spec(where, raw, "input_schema"))
    names = [spec.name for spec in specs]
    if len(set(names)) != len(names):
        raise InvalidRequest("tool names must be unique", param="tools")
    return tuple(specs)


_MODES: dict[str, Literal["auto", "required", "named", "none"]] = {
    "auto": "auto",
    "any": "required",
    "tool": "named",
    "none": "none",
}


def tool_choice(
    raw: dict[str, Any] | None, specs: tuple[ToolSpec, ...]
) -> tuple[ToolChoice | None, bool | None]:
    """The choice and ``parallel_tool_calls`` (``False`` when the client disabled them)."""
    if raw is None:
        return None, None
    mode = _MODES.get(raw.get("type", ""))
    if mode is None:
        raise InvalidRequest(
            "tool_choice type must be 'auto', 'any', 'tool' or 'none'", param="tool_choice.type"
        )
    name = raw.get("name")
    if mode == "named" and not isinstance(name, str):
        raise InvalidRequest("tool_choice of type 'tool' needs a name", param="tool_choice.name")
    if mode != "none" and not specs:
        raise InvalidRequest(
            "tool_choice is only allowed when tools are specified", param="tool_choice"
        )
    if mode == "named" and name not in {spec.name for spec in specs}:
        raise InvalidRequest(f"tool_choice names an unknown tool {name!r}", param="tool_choice")
    disable = raw.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise InvalidRequest(
            "disable_parallel_tool_use must be a boolean",
            param="tool_choice.disable_parallel_tool_use",
        )
    return ToolChoice(mode, name if mode == "named" else None), (False if disable else None)
