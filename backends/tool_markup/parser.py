"""A model's streamed text back into content and ``ToolCallDelta`` events: calls are
cut out of the text as their markup arrives, never leaking into the content."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace

from backends.base import FinishReason, TextDelta, ToolCallDelta
from backends.tool_markup.markup import CLOSE, OPEN, new_call_id

_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')

# A call whose head never matches is given up (emitted as text) past this many characters.
_MAX_HEAD = 4096


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
