"""Backend events → an Anthropic ``Message`` and its stream events.

One ``MessageAssembler`` per response, owned by the task serving it. A thought opens a
``thinking`` block (``thinking_delta`` fragments, then one ``signature_delta`` before its
stop, as Anthropic streams them; the signature seals the thought for the next turn,
``gateway.api.thought_seal``; with ``display: omitted`` only the signature is sent). Text
opens a ``text`` block; a tool call's first delta opens a ``tool_use`` block (ids ``toolu_...``)
whose ``input`` arrives as ``input_json_delta`` fragments. A finish on a stop string
the backend names is ``stop_reason: stop_sequence`` with that ``stop_sequence``; one it
does not name (Triton, llama.cpp) reads as ``end_turn``. A new block stops the one
before it, as Anthropic streams them. ``feed`` returns the frames an event produces (a
whole response just ignores them), so both modes build the same content.

Usage: ``input_tokens`` is known only once the backend's ``Usage`` arrives (the last
event), so ``message_start`` carries 0 and the ``message_delta`` carries the real count
next to ``output_tokens`` (the SDK's accumulator takes both from it).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic_core import from_json

from backends.base import (
    BackendEvent,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from gateway.api.thought_seal import ThoughtSeal

log = logging.getLogger(__name__)

_STOP_REASONS: dict[FinishReason, str] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
}
PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def tool_use_id(call_id: str) -> str:
    """The backend's ``call_...`` id in Anthropic's ``toolu_...`` form."""
    return "toolu_" + call_id.removeprefix("call_")


def event(kind: str, **fields: Any) -> bytes:
    payload = orjson.dumps({"type": kind, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


def usage_object(usage: Usage | None) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` counts only the prompt tokens NOT read from the
    cache (their total is ``input_tokens + cache_read_input_tokens``); nothing is ever
    written to a cache on request, so ``cache_creation_input_tokens`` is 0."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


@dataclass(slots=True)
class _Block:
    index: int
    kind: str  # "text" | "tool_use" | "thinking"
    parts: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""
    signature: str = ""  # a thinking block's, once it stopped

    def render(self, shown: bool = True) -> dict[str, Any]:
        if self.kind == "text":
            return {"type": "text", "text": "".join(self.parts)}
        if self.kind == "thinking":
            text = "".join(self.parts) if shown else ""
            return {"type": "thinking", "thinking": text, "signature": self.signature}
        return {
            "type": "tool_use",
            "id": self.call_id,
            "name": self.name,
            "input": _input(self.parts),
        }


def _input(parts: list[str]) -> Any:
    """The arguments as an object; a value cut short by ``max_tokens`` is completed as
    far as it got (the SDK's stream accumulator reads partial JSON the same way)."""
    text = "".join(parts)
    if not text.strip():
        return {}
    try:
        value = from_json(text, allow_partial=True)
    except ValueError:
        log.warning("tool call arguments are not JSON: %.80r", text)
        return {}
    return value if isinstance(value, dict) else {}


class MessageAssembler:
    __slots__ = (
        "_blocks",
        "_calls",
        "_open",
        "_pinged",
        "_seal",
        "_shown",
        "reason",
        "stop_sequence",
        "usage",
    )

    def __init__(self, seal: ThoughtSeal | None = None, *, shown: bool = True) -> None:
        """``seal`` signs thinking blocks (needed once a backend sends a thought);
        ``shown``: thinking blocks carry their text (else only their signature)."""
        self._seal = seal
        self._shown = shown
        self._blocks: list[_Block] = []
        self._calls: dict[int, _Block] = {}  # by the backend's call index
        self._open: _Block | None = None
        self._pinged = False
        self.reason: FinishReason | None = None
        self.stop_sequence: str | None = None  # the stop string that ended it, if known
        self.usage: Usage | None = None

    def feed(self, item: BackendEvent) -> list[bytes]:
        if isinstance(item, TextDelta):
            return self._text(item.text) if item.text else []
        if isinstance(item, ReasoningDelta):
            return self._thinking(item.text) if item.text else []
        if isinstance(item, ToolCallDelta):
            return self._tool_call(item)
        if isinstance(item, Finished):
            self.reason = item.reason
            self.stop_sequence = item.stop_sequence
        elif isinstance(item, Usage):
            self.usage = item
        return []

    @property
    def stop_reason(self) -> str:
        if self._calls and self.reason != "length":
            return "tool_use"
        if self.stop_sequence is not None:
            return "stop_sequence"
        return _STOP_REASONS[self.reason or "stop"]

    @property
    def matched_stop(self) -> str | None:
        """The ``stop_sequence`` field: set only with ``stop_reason: stop_sequence``."""
        return self.stop_sequence if self.stop_reason == "stop_sequence" else None

    @property
    def content(self) -> list[dict[str, Any]]:
        self._sign()  # a whole message: the open thinking block is complete
        return [block.render(self._shown) for block in self._blocks]

    def finish(self) -> list[bytes]:
        """Stop the open block; the ping goes out here when no block ever opened."""
        frames = self._stop()
        if not self._pinged:
            self._pinged = True
            frames.append(PING)
        return frames

    def _start(self, kind: str, call_id: str = "", name: str = "") -> tuple[_Block, list[bytes]]:
        frames = self._stop()
        block = self._open = _Block(len(self._blocks), kind, call_id=call_id, name=name)
        self._blocks.append(block)
        shown = block.render() if kind != "tool_use" else {**block.render(), "input": {}}
        frames.append(event("content_block_start", index=block.index, content_block=shown))
        if not self._pinged:  # where Anthropic sends its first ping
            self._pinged = True
            frames.append(PING)
        return block, frames

    def _stop(self) -> list[bytes]:
        block = self._open
        frames: list[bytes] = []
        if block is not None and block.kind == "thinking":
            delta = {"type": "signature_delta", "signature": self._sign()}
            frames.append(event("content_block_delta", index=block.index, delta=delta))
        self._open = None
        if block is not None:
            frames.append(event("content_block_stop", index=block.index))
        return frames

    def _sign(self) -> str:
        """Sign the open thinking block (if it is one) and return its signature."""
        block = self._open
        if block is None or block.kind != "thinking" or block.signature:
            return block.signature if block is not None else ""
        if self._seal is None:
            raise AssertionError("a thinking block needs the assembler's seal")
        block.signature = self._seal.seal("".join(block.parts))
        return block.signature

    def _thinking(self, text: str) -> list[bytes]:
        block, frames = self._open, list[bytes]()
        if block is None or block.kind != "thinking":
            block, frames = self._start("thinking")
        block.parts.append(text)
        if self._shown:
            delta = {"type": "thinking_delta", "thinking": text}
            frames.append(event("content_block_delta", index=block.index, delta=delta))
        return frames

    def _text(self, text: str) -> list[bytes]:
        block, frames = self._open, list[bytes]()
        if block is None or block.kind != "text":
            block, frames = self._start("text")
        block.parts.append(text)
        delta = {"type": "text_delta", "text": text}
        frames.append(event("content_block_delta", index=block.index, delta=delta))
        return frames

    def _tool_call(self, delta: ToolCallDelta) -> list[bytes]:
        frames: list[bytes] = []
        block = self._calls.get(delta.call_index)
        if block is None:
            call_id = tool_use_id(delta.id or new_id("call"))
            block, frames = self._start("tool_use", call_id=call_id, name=delta.name or "")
            self._calls[delta.call_index] = block
        if delta.arguments_fragment:
            # A fragment of a call whose block a later one already stopped (no backend
            # interleaves calls today) still goes out under its own index, which is
            # how clients accumulate; dropping it would lose arguments.
            block.parts.append(delta.arguments_fragment)
            json_delta = {"type": "input_json_delta", "partial_json": delta.arguments_fragment}
            frames.append(event("content_block_delta", index=block.index, delta=json_delta))
        return frames


def message_body(message_id: str, model: str, output: MessageAssembler) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": output.content,
        "stop_reason": output.stop_reason,
        "stop_sequence": output.matched_stop,
        "usage": usage_object(output.usage),
    }


def message_start(message_id: str, model: str) -> bytes:
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    return event("message_start", message=message)


def message_delta(output: MessageAssembler) -> bytes:
    return event(
        "message_delta",
        delta={"stop_reason": output.stop_reason, "stop_sequence": output.matched_stop},
        usage=usage_object(output.usage),
    )
