"""Backend events → Responses output items, and the stream events that announce them.

One ``OutputAssembler`` per response, owned by the task serving it. A thought opens a
``reasoning`` item with one ``reasoning_text`` part (streamed as
``response.reasoning_text.delta`` / ``.done``); text opens a ``message`` item with one
``output_text`` part; each tool call opens a ``function_call`` item. Calls stay open
together (a backend may interleave their argument fragments) until text or a thought
follows them or the generation ends; a call or text closes the thought before it, a
call the text, and a thought everything open. ``feed`` returns the stream frames an
event produces (a non-streamed response just ignores them), so both modes build the very
same output. The thought is sealed into ``encrypted_content`` when the request included
it (``seal``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.base import (
    BackendEvent,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from backends.base import Finished as FinishedEvent
from gateway.api.responses.render import (
    ItemStatus,
    event_logprobs,
    function_call_item,
    message_item,
    new_id,
    reasoning_item,
    reasoning_text,
    text_part,
)
from gateway.api.thought_seal import ThoughtSeal

Emit = Callable[..., bytes]
log = logging.getLogger(__name__)


@dataclass(slots=True)
class _OpenItem:
    output_index: int
    item_id: str
    kind: str  # "message" | "function_call" | "reasoning"
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


class OutputAssembler:
    __slots__ = (
        "_calls",
        "_done",
        "_emit",
        "_open",
        "_seal",
        "_text_item",
        "_thought_item",
        "finish_reason",
        "usage",
    )

    def __init__(self, emit: Emit, seal: ThoughtSeal | None = None) -> None:
        self._emit = emit
        self._seal = seal
        self._open: dict[int, _OpenItem] = {}  # by output index
        self._done: dict[int, dict[str, Any]] = {}
        self._text_item: _OpenItem | None = None
        self._thought_item: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # by the backend's call index
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None

    @property
    def status(self) -> Literal["completed", "incomplete"]:
        return "incomplete" if self.finish_reason == "length" else "completed"

    @property
    def output(self) -> list[dict[str, Any]]:
        return [self._done[index] for index in sorted(self._done)]

    def feed(self, event: BackendEvent) -> list[bytes]:
        if isinstance(event, TextDelta):
            return self._text(event.text, event.logprobs) if event.text or event.logprobs else []
        if isinstance(event, ReasoningDelta):
            return self._thought(event.text) if event.text else []
        if isinstance(event, ToolCallDelta):
            return self._tool_call(event)
        if isinstance(event, FinishedEvent):
            self.finish_reason = event.reason
        elif isinstance(event, Usage):
            self.usage = event
        return []

    def finish(self) -> list[bytes]:
        """Close every open item; a response without any output gets an empty message."""
        frames = self._close(*self._open.values())
        if not self._done:
            frames += self._text("")
            frames += self._close(*self._open.values())
        return frames

    def snapshot(self) -> list[dict[str, Any]]:
        """The output so far, open items included as ``incomplete`` (for failures)."""
        items = {index: self._render(item, "incomplete") for index, item in self._open.items()}
        items.update(self._done)
        return [items[index] for index in sorted(items)]

    def _text(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> list[bytes]:
        frames: list[bytes] = []
        item = self._text_item
        if item is None:
            # Text after a thought or tool calls: those are complete.
            frames += self._close(*self._calls.values(), *self._thoughts())
            item = self._text_item = self._start(new_id("msg"), "message")
            frames.append(self._added(item, message_item(item.item_id, None, "in_progress")))
            frames.append(
                self._emit("response.content_part.added", **self._where(item), part=text_part(""))
            )
        item.parts.append(text)
        item.logprobs.extend(logprobs)
        if text or logprobs:
            frames.append(
                self._emit(
                    "response.output_text.delta",
                    **self._where(item),
                    delta=text,
                    logprobs=event_logprobs(logprobs),
                )
            )
        return frames

    def _thoughts(self) -> tuple[_OpenItem, ...]:
        return () if self._thought_item is None else (self._thought_item,)

    def _thought(self, text: str) -> list[bytes]:
        frames: list[bytes] = []
        item = self._thought_item
        if item is None:
            # A thought after text or calls (a model thinking again): those are complete.
            frames += self._close(*self._open.values())
            item = self._thought_item = self._start(new_id("rs"), "reasoning")
            frames.append(self._added(item, reasoning_item(item.item_id, None, "in_progress")))
            frames.append(
                self._emit(
                    "response.content_part.added", **self._where(item), part=reasoning_text("")
                )
            )
        item.parts.append(text)
        frames.append(self._emit("response.reasoning_text.delta", **self._where(item), delta=text))
        return frames

    def _tool_call(self, event: ToolCallDelta) -> list[bytes]:
        frames: list[bytes] = []
        item = self._calls.get(event.call_index)
        if item is None:
            frames += self._close(*self._thoughts())
            if self._text_item is not None:
                frames += self._close(self._text_item)
            item = self._start(new_id("fc"), "function_call")
            item.call_id, item.name = event.id or new_id("call"), event.name or ""
            self._calls[event.call_index] = item
            frames.append(self._added(item, self._render(item, "in_progress")))
        if event.arguments_fragment:
            if item.output_index not in self._open:
                log.warning("dropped arguments for finished call %s", item.call_id)
                return frames
            item.parts.append(event.arguments_fragment)
            frames.append(
                self._emit(
                    "response.function_call_arguments.delta",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    delta=event.arguments_fragment,
                )
            )
        return frames

    def _start(self, item_id: str, kind: str) -> _OpenItem:
        item = _OpenItem(len(self._open) + len(self._done), item_id, kind)
        self._open[item.output_index] = item
        return item

    def _added(self, item: _OpenItem, announced: dict[str, Any]) -> bytes:
        return self._emit(
            "response.output_item.added", output_index=item.output_index, item=announced
        )

    def _close(self, *items: _OpenItem) -> list[bytes]:
        frames: list[bytes] = []
        for item in sorted(items, key=lambda open_item: open_item.output_index):
            if self._open.pop(item.output_index, None) is not None:
                frames += self._close_one(item)
        return frames

    def _close_one(self, item: _OpenItem) -> list[bytes]:
        status: ItemStatus = "incomplete" if self.finish_reason == "length" else "completed"
        done = self._done[item.output_index] = self._render(item, status)
        where = {"output_index": item.output_index, "item": done}
        if item.kind == "reasoning":
            self._thought_item = None
            text = "".join(item.parts)
            return [
                self._emit("response.reasoning_text.done", **self._where(item), text=text),
                self._emit(
                    "response.content_part.done", **self._where(item), part=reasoning_text(text)
                ),
                self._emit("response.output_item.done", **where),
            ]
        if item.kind == "message":
            self._text_item = None
            text, logprobs = "".join(item.parts), item.logprobs
            return [
                self._emit(
                    "response.output_text.done",
                    **self._where(item),
                    text=text,
                    logprobs=event_logprobs(logprobs),
                ),
                self._emit(
                    "response.content_part.done",
                    **self._where(item),
                    part=text_part(text, logprobs),
                ),
                self._emit("response.output_item.done", **where),
            ]
        return [
            self._emit(
                "response.function_call_arguments.done",
                item_id=item.item_id,
                output_index=item.output_index,
                name=item.name,
                arguments=done["arguments"],
            ),
            self._emit("response.output_item.done", **where),
        ]

    @staticmethod
    def _where(item: _OpenItem) -> dict[str, Any]:
        return {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}

    def _render(self, item: _OpenItem, status: ItemStatus) -> dict[str, Any]:
        text = "".join(item.parts)
        if item.kind == "reasoning":
            sealed = self._seal.seal(text) if self._seal is not None else None
            return reasoning_item(item.item_id, text, status, sealed)
        if item.kind == "message":
            return message_item(item.item_id, text, status, item.logprobs)
        return function_call_item(item.item_id, item.call_id, item.name, text, status)
