"""Recognise a plain stream chunk by its bytes: the fast path of ``stream.ChunkTranslator``.

An engine writes every plain delta of a stream in one shape: the same bytes around one
JSON string, the content (or the thought) of one choice. A ``Shape`` is learnt from a
chunk that the full parse (orjson) found plain (``learn``): one choice, no finish reason,
logprobs, tool calls, usage or error, and exactly one non-empty text field. It keeps the
bytes before and after that field's string. A later payload made of the same prefix, a
valid JSON string body and the same suffix parses, by construction, to the same object
with only that string changed, so the translator needs nothing from it but the string
(``Shape.text``): no JSON object is built, no field is looked up.

Why the match is exact: JSON is read left to right without look-back, the prefix ends
just inside the string, and the middle is accepted only when ``"`` + middle + ``"``
alone is one complete, valid JSON string (decoded by orjson where it holds an escape, a
quote or a control character: the same decoder as the full parse; else by a strict
UTF-8 decode, which accepts exactly the bytes orjson accepts). Anything else (another
shape, a bad string) returns None and the payload takes the full parse, which also
raises for invalid JSON as before. A key is recognised only where JSON allows one: after
``{`` or ``,`` and before ``:``, which text inside a string cannot imitate (its quotes
are escaped).

Engines whose shape changes now and then (llama.cpp stamps ``created`` with the current
second) relearn at each change; one whose every delta differs in more than its text
stops being learnt after a few shapes that nothing matched (``stream._MAX_UNUSED``). The
shapes are owned by the translator of one stream.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

_SPECIAL = re.compile(rb'["\\\x00-\x1f]')
"""Bytes that a JSON string body holds only escaped (or as part of an escape)."""
_SPACE = b" \t\r\n"
_CONTENT = b'"content"'
_TEXT = b'"text"'
_THOUGHT_KEYS = ("reasoning_content", "reasoning")


class Shape:
    """The bytes of one stream's plain chunks around their text. Read-only once made."""

    __slots__ = ("_cut", "_prefix", "_size", "_start", "_suffix", "index", "thought")

    def __init__(self, prefix: bytes, suffix: bytes, index: Any, *, thought: bool) -> None:
        self._prefix = prefix
        self._suffix = suffix
        self._start = len(prefix)
        self._cut = -len(suffix)
        self._size = len(prefix) + len(suffix)
        self.index = index
        """The choice's ``index`` as the full parse read it."""
        self.thought = thought
        """The string is the choice's thought (``reasoning_content``/``reasoning``)."""

    def text(self, payload: bytes) -> str | None:
        """The string ``payload`` carries if it has this shape, else None."""
        if (
            len(payload) < self._size
            or not payload.startswith(self._prefix)
            or not payload.endswith(self._suffix)
        ):
            return None
        return string_body(payload[self._start : self._cut])

    def same_slot(self, other: Shape) -> bool:
        return self.index == other.index and self.thought == other.thought


def string_body(body: bytes) -> str | None:
    """The value of the JSON string ``"body"``, or None if that is not one valid string."""
    if _SPECIAL.search(body) is None:
        try:
            return body.decode()
        except UnicodeDecodeError:
            return None
    try:
        value = orjson.loads(b'"' + body + b'"')
    except orjson.JSONDecodeError:
        return None
    return value if type(value) is str else None


def learn(chunk: Any, payload: bytes, *, chat: bool) -> Shape | None:
    """The shape of ``payload`` if its parsed value ``chunk`` is a plain delta (see the
    module doc), else None."""
    if type(chunk) is not dict or chunk.get("error") or chunk.get("usage"):
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("logprobs") or choice.get("finish_reason"):
        return None
    found = _text_field(choice, chat=chat)
    if found is None:
        return None
    key, value, thought = found
    span = _string_after(payload, key)
    if span is None or string_body(payload[span[0] : span[1]]) != value:
        return None
    return Shape(payload[: span[0]], payload[span[1] :], choice.get("index") or 0, thought=thought)


def _text_field(choice: dict[str, Any], *, chat: bool) -> tuple[bytes, str, bool] | None:
    """``(key, value, is thought)`` of the one non-empty text field of a plain choice."""
    if not chat:
        text = choice.get("text")
        return (_TEXT, text, False) if type(text) is str and text else None
    delta = choice.get("delta")
    if type(delta) is not dict or delta.get("tool_calls"):
        return None
    content = delta.get("content")
    thoughts = [(name, delta.get(name)) for name in _THOUGHT_KEYS if delta.get(name)]
    if content and not thoughts:
        return (_CONTENT, content, False) if type(content) is str else None
    if len(thoughts) == 1 and not content:
        name, thought = thoughts[0]
        key = b'"' + name.encode() + b'"'
        return (key, thought, True) if type(thought) is str else None
    return None


def _string_after(payload: bytes, key: bytes) -> tuple[int, int] | None:
    """Where the body of the string value of ``key`` lies in ``payload``, when exactly
    one object key there is ``key`` and its value is a string."""
    value = -1
    at = payload.find(key)
    while at != -1:
        before = payload[:at].rstrip(_SPACE)
        after = len(payload) - len(payload[at + len(key) :].lstrip(_SPACE))
        if before[-1:] in (b"{", b",") and payload[after : after + 1] == b":":
            if value != -1:
                return None  # two keys of that name: not a shape to learn
            value = len(payload) - len(payload[after + 1 :].lstrip(_SPACE))
        at = payload.find(key, at + 1)
    if value == -1 or payload[value : value + 1] != b'"':
        return None
    start = value + 1
    end = payload.find(b'"', start)
    while end != -1:
        backslashes = end - len(payload[start:end].rstrip(b"\\")) - start
        if backslashes % 2 == 0:
            return start, end
        end = payload.find(b'"', end + 1)
    return None
