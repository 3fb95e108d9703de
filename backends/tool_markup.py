"""Tool calls as text, for backends that own the prompt (hf, Triton): Hermes-style markup.

A call is written ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``: the
format of Hermes, Qwen 2.5/3 and the many chat templates that copied them, and the one
the grammar (``xgrammar``'s ``qwen_3`` structural tag) forces. This module renders tools
and past calls into chat messages (through the template when it takes ``tools``, else as
a system prompt), and ``ToolCallParser`` turns a model's streamed text back into content
and ``ToolCallDelta`` events, never leaking the markup into the content.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Any

from backends.base import (
    ChatMessage,
    FinishReason,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
# A call whose head never matches is given up (emitted as text) past this many characters.
_MAX_HEAD = 4096


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tools_active(request: GenerationRequest) -> bool:
    return bool(request.tools) and request.effective_tool_choice.mode != "none"


def render_call(call: ToolCall) -> str:
    return f'{OPEN}\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}\n{CLOSE}'


def _tool_json(tool: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def tools_json(request: GenerationRequest) -> list[dict[str, Any]]:
    """The request's tools in the OpenAI shape (what templates and xgrammar take)."""
    return [_tool_json(tool) for tool in request.tools]


def tools_system_prompt(request: GenerationRequest) -> str:
    """How the tools are explained to a model whose chat template does not take them."""
    listing = "\n".join(json.dumps(tool) for tool in tools_json(request))
    return (
        "You can call functions to help answer. The functions, as JSON signatures:\n"
        f"<tools>\n{listing}\n</tools>\n"
        "To call a function, answer with a JSON object naming it and its arguments, "
        "inside tags:\n"
        f'{OPEN}\n{{"name": "function name", "arguments": {{...}}}}\n{CLOSE}'
    )


def chat_messages(request: GenerationRequest, template_takes_tools: bool) -> list[dict[str, Any]]:
    """The request's messages as chat-template dicts, with tools and past calls rendered.

    A template that takes ``tools`` gets calls and tool results in the Hugging Face shape
    (it renders them itself); otherwise calls become markup in the assistant's text, tool
    results a ``<tool_response>`` user turn, and the tools a system prompt.
    """
    messages = [_message(m, template_takes_tools) for m in request.messages]
    if tools_active(request) and not template_takes_tools:
        prompt = tools_system_prompt(request)
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + prompt}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
    return messages


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a ``tools`` list itself (Hermes, Qwen, Llama 3)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def render_chat(tokenizer: Any, request: GenerationRequest) -> str:
    """The prompt text of a chat request, tools and past calls included."""
    takes_tools = template_takes_tools(tokenizer)
    extra: dict[str, Any] = {}
    if takes_tools and tools_active(request):
        extra["tools"] = tools_json(request)
    text = tokenizer.apply_chat_template(
        chat_messages(request, takes_tools), tokenize=False, add_generation_prompt=True, **extra
    )
    return str(text)


def structured_outputs(request: GenerationRequest) -> dict[str, Any] | None:
    """The request's constraint as vLLM's ``structured_outputs`` parameters (what Triton's
    vLLM backend takes in ``sampling_parameters``), or ``None`` for free text. Tool calls
    use an xgrammar structural tag with the Hermes markup above."""
    if tools_active(request):
        return {"structural_tag": json.dumps(_tool_tag(request))}
    fmt = request.response_format
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema":
        return {"json": fmt.schema if fmt.schema is not None else {}}
    return None


def _tool_tag(request: GenerationRequest) -> dict[str, Any]:
    choice = request.effective_tool_choice
    single = request.parallel_tool_calls is not True or choice.mode == "named"
    tags = [
        {
            "type": "tag",
            "begin": f'{OPEN}\n{{"name": {json.dumps(tool.name)}, "arguments": ',
            "content": {"type": "json_schema", "json_schema": tool.parameters},
            "end": f"}}\n{CLOSE}",
        }
        for tool in request.tools
        if choice.mode != "named" or tool.name == choice.name
    ]
    body: dict[str, Any] = (
        {"type": "triggered_tags", "triggers": [OPEN], "tags": tags, "stop_after_first": single}
        if choice.mode == "auto"
        else {
            "type": "tags_with_separator",
            "tags": tags,
            "separator": "\n",
            "at_least_one": True,
            "stop_after_first": single,
        }
    )
    return {"type": "structural_tag", "format": body}


def _message(message: ChatMessage, template_takes_tools: bool) -> dict[str, Any]:
    if template_takes_tools:
        out: dict[str, Any] = {"role": message.role, "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments(call)},
                }
                for call in message.tool_calls
            ]
        if message.role == "tool":
            out["tool_call_id"] = message.tool_call_id
            if message.name:
                out["name"] = message.name
        return out
    if message.tool_calls:
        text = "\n".join([message.content, *(render_call(c) for c in message.tool_calls)])
        return {"role": "assistant", "content": text.strip("\n")}
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.content}\n</tool_response>"}
    return {"role": message.role, "content": message.content}


def _arguments(call: ToolCall) -> Any:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments


@dataclass(slots=True)
class ToolCallParser:
    """Splits one choice's streamed text into content and tool-call deltas.

    Owner: whoever streams the choice (the hf engine thread, a Triton stream). States:
    ``text`` (content; a tail that may start ``<tool_call>`` is held back), ``head``
    (inside a call, until ``{"name": ..., "arguments": `` is complete), ``args`` (argument
    fragments pass straight through while a string-aware depth count finds the value's
    end) and ``tail`` (up to ``</tool_call>``, dropped).
    """

    index: int
    calls: int = 0
    _state: str = "text"
    _buffer: str = ""
    _depth: int = 0
    _in_string: bool = False
    _escaped: bool = False
    _out: list[str | ToolCallDelta] = field(default_factory=list)

    def feed(self, text: str) -> list[str | ToolCallDelta]:
        """Content strings and ``ToolCallDelta`` values for ``text``, in order."""
        self._buffer += text
        self._out = []
        progressed = True
        while progressed and self._buffer:
            progressed = getattr(self, f"_{self._state}")()
        return self._out

    def flush(self, *, cut: bool = False) -> list[str | ToolCallDelta]:
        """At the end of the choice: held-back content is content after all, unless
        ``cut`` (max_tokens) ended it inside what was becoming a ``<tool_call>``."""
        self._out = []
        if self._state == "text" and self._buffer and not cut:
            self._out.append(self._buffer)
        self._buffer = ""
        return self._out

    def _text(self) -> bool:
        if self.calls:  # the newline that separates calls is markup, not content
            self._buffer = self._buffer.lstrip("\n")
        at = self._buffer.find(OPEN)
        if at >= 0:
            self._emit_text(self._buffer[:at])
            self._buffer = self._buffer[at + len(OPEN) :]
            self._state = "head"
            return True
        keep = _partial_suffix(self._buffer, OPEN)
        self._emit_text(self._buffer[: len(self._buffer) - keep])
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return False

    def _head(self) -> bool:
        match = _HEAD.match(self._buffer)
        if match is not None:
            name = json.loads(f'"{match.group(1)}"')
            self._out.append(ToolCallDelta(self.index, self.calls, new_call_id(), name))
            self._buffer = self._buffer[match.end() :]
            self._state, self._depth, self._in_string, self._escaped = "args", 0, False, False
            return True
        end = self._buffer.find(CLOSE)
        if end >= 0 or len(self._buffer) > _MAX_HEAD:
            self._whole_call(self._buffer[:end] if end >= 0 else self._buffer)
            self._buffer = self._buffer[end + len(CLOSE) :] if end >= 0 else ""
            self._state = "text"
            return True
        return False

    def _whole_call(self, raw: str) -> None:
        """A call whose keys came in another order: parse it whole, or keep it as text."""
        try:
            value = json.loads(raw)
            name, arguments = value["name"], value.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            self._emit_text(OPEN + raw + CLOSE)
            return
        self._out.append(
            ToolCallDelta(self.index, self.calls, new_call_id(), str(name), json.dumps(arguments))
        )
        self.calls += 1

    def _args(self) -> bool:
        if self._depth == 0:  # whitespace before the value is not part of the arguments
            self._buffer = self._buffer.lstrip()
        for position, char in enumerate(self._buffer):
            if self._step(char):
                self._emit_arguments(self._buffer[: position + 1])
                self._buffer = self._buffer[position + 1 :]
                self._state = "tail"
                self.calls += 1
                return True
        self._emit_arguments(self._buffer)
        self._buffer = ""
        return False

    def _step(self, char: str) -> bool:
        """Advance the depth count by ``char``; true when it closes the arguments value."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
            return False
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            return self._depth == 0
        return False

    def _tail(self) -> bool:
        end = self._buffer.find(CLOSE)
        if end < 0:
            keep = _partial_suffix(self._buffer, CLOSE)
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        self._buffer = self._buffer[end + len(CLOSE) :]
        self._state = "text"
        return True

    def _emit_text(self, text: str) -> None:
        if text:
            self._out.append(text)

    def _emit_arguments(self, fragment: str) -> None:
        if fragment:
            self._out.append(ToolCallDelta(self.index, self.calls, arguments_fragment=fragment))


def as_events(
    pieces: list[str | ToolCallDelta], index: int, num_tokens: int
) -> list[TextDelta | ToolCallDelta]:
    """A parser's output as events; the tokens behind them ride on the first."""
    events: list[TextDelta | ToolCallDelta] = []
    for piece in pieces:
        tokens = 0 if events else num_tokens
        if isinstance(piece, str):
            events.append(TextDelta(index, piece, num_tokens=tokens))
        else:
            events.append(replace(piece, num_tokens=tokens))
    return events


def content_events(
    parser: ToolCallParser | None, text: str, num_tokens: int
) -> list[TextDelta | ToolCallDelta]:
    """Events for a piece of streamed choice-0 text: as is without a parser."""
    if parser is None:
        return [TextDelta(0, text, num_tokens=num_tokens)]
    return as_events(parser.feed(text), parser.index, num_tokens)


def closing_events(
    parser: ToolCallParser | None, reason: FinishReason
) -> tuple[list[TextDelta | ToolCallDelta], FinishReason]:
    """What the parser still holds at the end, and the finish reason (``tool_calls``
    when the choice made calls and ended on its own)."""
    if parser is None:
        return [], reason
    events = as_events(parser.flush(cut=reason == "length"), parser.index, 0)
    return events, "tool_calls" if parser.calls and reason == "stop" else reason


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
