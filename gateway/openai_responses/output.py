"""Backend events → Responses output items, and the stream events that announce them.

One ``OutputAssembler`` per response, owned by the task serving it. Text opens a
``message`` item with one ``output_text`` part; each tool call opens a ``function_call``
item; an item closes when the next one opens or the generation ends. ``feed`` returns the
stream frames an event produces (a non-streamed response just ignores them), so both
modes build the very same output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.base import (
    BackendEvent,
    FinishReason,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from backends.base import Finished as FinishedEvent
from gateway.openai_responses.render import (
    ItemStatus,
    event_logprobs,
    function_call_item,
    message_item,
    new_id,
    text_part,
)

Emit = Callable[..., bytes]


@dataclass(slots=True)
class _OpenItem:
    output_index: int
    item_id: str
    kind: str  # "message" | "function_call"
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


class OutputAssembler:
    __slots__ = ("_calls", "_emit", "_open", "finish_reason", "output", "usage")

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._open: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}
        self.output: list[dict[str, Any]] = []
        self.finish_reason: FinishReason | None = None
        self.usage: Usage | None = None

    @property
    def status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def feed(self, event: BackendEvent) -> list[bytes]:
        if isinstance(event, TextDelta):
            return self._text(event.text, event.logprobs) if event.text or event.logprobs else []
        if isinstance(event, ToolCallDelta):
            return self._tool_call(event)
        if isinstance(event, FinishedEvent):
            self.finish_reason = event.reason
        elif isinstance(event, Usage):
            self.usage = event
        return []

    def finish(self) -> list[bytes]:
        """Close the open item; a response without any output gets an empty message."""
        frames = self._close()
        if not self.output:
            frames += self._text("")
            frames += self._close()
        return frames

    def snapshot(self) -> list[dict[str, Any]]:
        """The output so far, the open item included as ``incomplete`` (for failures)."""
        items = list(self.output)
        if self._open is not None:
            items.append(self._render(self._open, "incomplete"))
        return items

    def _text(self, text: str, logprobs: Sequence[TokenLogprob] = ()) -> list[bytes]:
        frames: list[bytes] = []
        item = self._open
        if item is None or item.kind != "message":
            frames += self._close()
            item = self._start(_OpenItem(len(self.output), new_id("msg"), "message"))
            frames.append(
                self._emit(
                    "response.output_item.added",
                    output_index=item.output_index,
                    item=message_item(item.item_id, None, "in_progress"),
                )
            )
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

    def _tool_call(self, event: ToolCallDelta) -> list[bytes]:
        frames: list[bytes] = []
        item = self._calls.get(event.call_index)
        if item is None:
            frames += self._close()
            item = self._start(
                _OpenItem(
                    len(self.output),
                    new_id("fc"),
                    "function_call",
                    call_id=event.id or new_id("call"),
                    name=event.name or "",
                )
            )
            self._calls[event.call_index] = item
            frames.append(
                self._emit(
                    "response.output_item.added",
                    output_index=item.output_index,
                    item=self._render(item, "in_progress"),
                )
            )
        if event.arguments_fragment and item is self._open:
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

    def _start(self, item: _OpenItem) -> _OpenItem:
        self._open = item
        return item

    def _close(self) -> list[bytes]:
        item = self._open
        if item is None:
            return []
        self._open = None
        status: ItemStatus = "incomplete" if self.finish_reason == "length" else "completed"
        done = self._render(item, status)
        self.output.append(done)
        where = {"output_index": item.output_index, "item": done}
        if item.kind == "message":
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

    def _added(self, item: _OpenItem, announced: dict[str, Any]) -> bytes:
        return self._emit(
            "response.output_item.added", output_index=item.output_index, item=announced
        )

    @staticmethod
    def _where(item: _OpenItem) -> dict[str, Any]:
        return {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}

    @staticmethod
    def _render(item: _OpenItem, status: ItemStatus) -> dict[str, Any]:
        text = "".join(item.parts)
        if item.kind == "message":
            return message_item(item.item_id, text, status, item.logprobs)
        return function_call_item(item.item_id, item.call_id, item.name, text, status)
