"""OpenAI response bodies and SSE frames, built as plain dicts and encoded with orjson.

Shapes follow the official schemas (validated in tests/unit/test_responses_schema.py):
chat ``chat.completion`` / ``chat.completion.chunk`` and legacy ``text_completion``.
A reasoning model's thought goes in the message (or delta) twice, as
``reasoning_content`` (DeepSeek's name, which LiteLLM and most clients read) and as
``reasoning`` (vLLM's), and its tokens in ``usage.completion_tokens_details``; neither
field is sent for a model that did not think. Legacy completions carry raw text only.
Usage always says how many prompt tokens were read from a prefix cache
(``prompt_tokens_details.cached_tokens``, 0 when none or unknown), as OpenAI does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from backends.base import FinishReason, RequestKind, TokenLogprob, ToolCallDelta, Usage
from gateway.observe.ids import fresh_hex

SSE_DONE = b"data: [DONE]\n\n"
END_OF_FRAMES = b""
"""Yielded by a frame producer after its last frame: nothing more will be sent, so the
edge completes the response at once (``gateway.edge.sse_batch``); the producer's cleanup runs
when it is stepped again. An empty frame carries nothing, so other consumers may send it."""


def new_id(kind: RequestKind) -> str:
    prefix = "chatcmpl-" if kind is RequestKind.CHAT else "cmpl-"
    return prefix + fresh_hex(12)


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage_dict(usage: Usage) -> dict[str, Any]:
    rendered: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if usage.reasoning_tokens:
        rendered["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return rendered


def reasoning_fields(text: str) -> dict[str, str]:
    """The thought under both names clients read (see the module doc)."""
    return {"reasoning_content": text, "reasoning": text}


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": entry.logprob,
                "bytes": list(entry.bytes),
                "top_logprobs": [
                    {"token": top.token, "logprob": top.logprob, "bytes": list(top.bytes)}
                    for top in entry.top
                ],
            }
            for entry in entries
        ],
        "refusal": None,
    }


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    offsets, position = [], offset
    for entry in entries:
        offsets.append(position)
        position += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [
            None if entry.logprob is None else {top.token: top.logprob for top in entry.top}
            for entry in entries
        ],
        "text_offset": offsets,
    }


@dataclass(slots=True)
class ChoiceAccumulator:
    """Text, thought, logprobs and finish reason of one choice of a non-streamed
    response."""

    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    # call_index -> [id, name, argument fragments...]
    tool_calls: dict[int, list[str]] = field(default_factory=dict)
    reasoning: list[str] = field(default_factory=list)

    def add_tool_delta(self, delta: ToolCallDelta) -> None:
        call = self.tool_calls.setdefault(delta.call_index, ["", ""])
        if delta.id is not None:
            call[0] = delta.id
        if delta.name is not None:
            call[1] = delta.name
        call.append(delta.arguments_fragment)

    def rendered_tool_calls(self) -> list[dict[str, Any]]:
        return [
            {
                "id": call[0],
                "type": "function",
                "function": {"name": call[1], "arguments": "".join(call[2:])},
            }
            for _, call in sorted(self.tool_calls.items())
        ]


def full_response(
    kind: RequestKind,
    *,
    response_id: str,
    created: int,
    model: str,
    choices: Sequence[ChoiceAccumulator],
    usage: Usage,
    want_logprobs: bool,
    legacy_functions: bool = False,
) -> dict[str, Any]:
    """``legacy_functions``: the request used ``functions``, so a call is answered as the
    old ``function_call`` (its first call; legacy requests allow one) with that reason."""
    rendered = [
        _chat_choice(index, choice, want_logprobs, legacy_functions)
        if kind is RequestKind.CHAT
        else _completion_choice(index, choice, want_logprobs)
        for index, choice in enumerate(choices)
    ]
    return {
        "id": response_id,
        "object": "chat.completion" if kind is RequestKind.CHAT else "text_completion",
        "created": created,
        "model": model,
        "choices": rendered,
        "usage": usage_dict(usage),
    }


def _chat_choice(
    index: int, choice: ChoiceAccumulator, want_logprobs: bool, legacy: bool
) -> dict[str, Any]:
    text = "".join(choice.parts)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if choice.reasoning:
        message.update(reasoning_fields("".join(choice.reasoning)))
    reason: str = choice.finish_reason or "stop"
    if choice.tool_calls:
        # As OpenAI: a turn that only calls tools has null content.
        message["content"] = text or None
        calls = choice.rendered_tool_calls()
        if legacy:
            message["function_call"] = calls[0]["function"]
            reason = _legacy_reason(reason)
        else:
            message["tool_calls"] = calls
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(choice.logprobs) if want_logprobs else None,
        "finish_reason": reason,
    }


def _legacy_reason(reason: str) -> str:
    return "function_call" if reason == "tool_calls" else reason


def _completion_choice(
    index: int, choice: ChoiceAccumulator, want_logprobs: bool
) -> dict[str, Any]:
    return {
        "index": index,
        "text": "".join(choice.reasoning) + "".join(choice.parts),
        "logprobs": completion_logprobs(choice.logprobs, 0) if want_logprobs else None,
        "finish_reason": choice.finish_reason or "stop",
    }


_PLAIN_TEXT_END = b'},"logprobs":null,"finish_reason":null}]}\n\n'


class ChunkWriter:
    """Frames stream chunks for one response: fixed id, created and model on each."""

    __slots__ = ("_chat", "_head", "_legacy", "_offsets", "_plain_heads", "_want_logprobs")

    def __init__(
        self,
        kind: RequestKind,
        response_id: str,
        created: int,
        model: str,
        want_logprobs: bool,
        *,
        legacy_functions: bool = False,
    ) -> None:
        self._chat = kind is RequestKind.CHAT
        self._legacy = legacy_functions
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        head = {"id": response_id, "object": obj, "created": created, "model": model}
        # Every frame starts with the same four fields: encoded once, not per frame.
        self._head = b"data: " + orjson.dumps(head)[:-1] + b","
        self._want_logprobs = want_logprobs
        self._offsets: dict[int, int] = {}
        # A chat text frame without logprobs, up to its text, by choice: the stream's most
        # frequent frame is these bytes, the text as JSON and ``_PLAIN_TEXT_END``.
        self._plain_heads: dict[int, bytes] = {}

    def role(self, index: int) -> bytes:
        delta = {"role": "assistant", "content": ""}
        return self._frame({"choices": [self._chat_choice(index, delta, None, None)]})

    def text(self, index: int, text: str, logprobs: Sequence[TokenLogprob]) -> bytes:
        if self._chat and not self._want_logprobs:
            head = self._plain_heads.get(index)
            if head is None:
                head = self._plain_heads[index] = b"".join(
                    (
                        self._head,
                        b'"choices":[{"index":',
                        orjson.dumps(index),
                        b',"delta":{"content":',
                    )
                )
            return b"".join((head, orjson.dumps(text), _PLAIN_TEXT_END))
        if self._chat:
            rendered = chat_logprobs(logprobs) if self._want_logprobs else None
            choice = self._chat_choice(index, {"content": text}, None, rendered)
        else:
            offset = self._offsets.get(index, 0)
            self._offsets[index] = offset + len(text)
            rendered = completion_logprobs(logprobs, offset) if self._want_logprobs else None
            choice = {"index": index, "text": text, "logprobs": rendered, "finish_reason": None}
        return self._frame({"choices": [choice]})

    def reasoning(self, index: int, text: str) -> bytes | None:
        """A piece of thought (``None``: nothing to send). A completion has no thought
        apart: a backend that split one anyway sends it as text."""
        if not text:
            return None
        if not self._chat:
            return self.text(index, text, ())
        return self._frame(
            {"choices": [self._chat_choice(index, reasoning_fields(text), None, None)]}
        )

    def tool_call(self, delta: ToolCallDelta) -> bytes | None:
        """A call's first chunk names it (index, id, type, name); later ones add only
        argument fragments: the shape the OpenAI SDK's stream helper accumulates. For a
        legacy ``functions`` request: ``function_call`` deltas (name, then arguments) of
        the first call, and ``None`` (nothing to send) for any other."""
        if self._legacy:
            if delta.call_index:
                return None  # one function_call per turn; an engine's extra calls are dropped
            function: dict[str, Any] = {"arguments": delta.arguments_fragment}
            if delta.id is not None:
                function = {"name": delta.name or "", **function}
            choice = self._chat_choice(delta.index, {"function_call": function}, None, None)
            return self._frame({"choices": [choice]})
        call: dict[str, Any] = {"index": delta.call_index}
        if delta.id is not None:
            call["id"] = delta.id
            call["type"] = "function"
            call["function"] = {"name": delta.name or "", "arguments": delta.arguments_fragment}
        else:
            call["function"] = {"arguments": delta.arguments_fragment}
        choice = self._chat_choice(delta.index, {"tool_calls": [call]}, None, None)
        return self._frame({"choices": [choice]})

    def finish(self, index: int, reason: FinishReason) -> bytes:
        if self._chat:
            shown = _legacy_reason(reason) if self._legacy else reason
            choice = self._chat_choice(index, {}, shown, None)
        else:
            choice = {"index": index, "text": "", "logprobs": None, "finish_reason": reason}
        return self._frame({"choices": [choice]})

    def usage(self, usage: Usage) -> bytes:
        return self._frame({"choices": [], "usage": usage_dict(usage)})

    def _frame(self, rest: dict[str, Any]) -> bytes:
        """``data: {head..., rest...}``: byte for byte what ``sse({**head, **rest})`` makes."""
        return b"".join((self._head, orjson.dumps(rest)[1:], b"\n\n"))

    @staticmethod
    def _chat_choice(
        index: int, delta: dict[str, Any], reason: str | None, logprobs: dict[str, Any] | None
    ) -> dict[str, Any]:
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
