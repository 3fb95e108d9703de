"""One choice's generated text into events, for backends that read raw model text
(Triton here; the hf engine's token loop has its own): the thought split off first by
the model's reasoning parser (``backends.reasoning``), then tool calls read from the
answer only (``parser.ToolCallParser``), so neither a grammar's value nor a call is ever
looked for inside a thought.
"""

from __future__ import annotations

from backends.base import FinishReason, ReasoningDelta, TextDelta, ToolCallDelta
from backends.reasoning import ReasoningParser
from backends.tool_markup.parser import ToolCallParser, as_events, closing_events

ChoiceEvent = ReasoningDelta | TextDelta | ToolCallDelta


class ChoiceText:
    """Owned by whoever streams the choice. ``thinking``: the choice's reasoning parser
    (None: all answer, as for a model without one or a completion); ``tools``: its tool
    call parser (None: no tools active). ``thought`` and ``thought_pieces`` say what was
    thought, for counting its tokens."""

    __slots__ = ("_parts", "_thinking", "_tools", "index", "thought_pieces")

    def __init__(
        self, index: int, thinking: ReasoningParser | None, tools: ToolCallParser | None
    ) -> None:
        self.index = index
        self._thinking = thinking
        self._tools = tools
        self._parts: list[str] = []
        self.thought_pieces = 0
        """Pieces of text that carried thought (a token count where there is no tokenizer)."""

    @property
    def thought(self) -> str:
        return "".join(self._parts)

    def feed(self, text: str, num_tokens: int) -> list[ChoiceEvent]:
        """The events of a piece of text; its tokens ride on the first."""
        if self._thinking is None:
            return self._answer(text, num_tokens)
        split = self._thinking.feed(text)
        return self._events(split.reasoning, split.content, num_tokens)

    def finish(self, reason: FinishReason) -> tuple[list[ChoiceEvent], FinishReason]:
        """What the parsers held back at the end, and the finish reason (``tool_calls``
        when the answer made calls and ended on its own)."""
        events: list[ChoiceEvent] = []
        if self._thinking is not None:
            split = self._thinking.finish()
            events = self._events(split.reasoning, split.content, 0)
        if self._tools is None:
            return events, reason
        tail, reason = closing_events(self._tools, reason)
        return [*events, *tail], reason

    def _events(self, thought: str, answer: str, num_tokens: int) -> list[ChoiceEvent]:
        events: list[ChoiceEvent] = []
        if thought:
            self._parts.append(thought)
            self.thought_pieces += 1
            events.append(ReasoningDelta(self.index, thought, num_tokens))
            num_tokens = 0
        if answer:
            events.extend(self._answer(answer, num_tokens))
        return events

    def _answer(self, text: str, num_tokens: int) -> list[ChoiceEvent]:
        if self._tools is None:
            return [TextDelta(self.index, text, num_tokens=num_tokens)]
        return list(as_events(self._tools.feed(text), self.index, num_tokens))
