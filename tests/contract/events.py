"""Reading a backend's event stream the way the contract (``backends/base.py``) says."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from backends.base import (
    BackendEvent,
    Finished,
    PromptLogprobs,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCallDelta,
    Usage,
)


def check_order(events: list[BackendEvent]) -> None:
    """Zero or one Started, first; zero or one PromptLogprobs next; per index deltas then
    one Finished; Usage last, once."""
    assert isinstance(events[-1], Usage), events[-1:]
    assert sum(isinstance(e, Usage) for e in events) == 1
    body = events[1:-1] if isinstance(events[0], Started) else events[:-1]
    if body and isinstance(body[0], PromptLogprobs):
        body = body[1:]
    finished: set[int] = set()
    for event in body:
        assert isinstance(event, ReasoningDelta | TextDelta | ToolCallDelta | Finished), (
            f"{event!r} out of place"
        )
        assert event.index not in finished, "event after Finished for the same index"
        if isinstance(event, Finished):
            finished.add(event.index)
    assert finished == set(range(len(finished))), finished


@dataclass
class Result:
    events: list[BackendEvent]

    def text(self, index: int = 0) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta) and e.index == index)

    def thought(self, index: int = 0) -> str:
        return "".join(
            e.text for e in self.events if isinstance(e, ReasoningDelta) and e.index == index
        )

    def calls(self, index: int = 0) -> list[tuple[str, str]]:
        """(name, arguments) of each tool call of choice ``index``, from its deltas."""
        calls: dict[int, list[str]] = {}
        for e in self.events:
            if isinstance(e, ToolCallDelta) and e.index == index:
                entry = calls.setdefault(e.call_index, ["", ""])
                entry[0] = e.name or entry[0]
                entry[1] += e.arguments_fragment
        return [(name, args) for name, args in calls.values()]

    def reason(self, index: int = 0) -> str:
        return next(e.reason for e in self.events if isinstance(e, Finished) and e.index == index)

    @property
    def prompt(self) -> PromptLogprobs:
        return next(e for e in self.events if isinstance(e, PromptLogprobs))

    @property
    def usage(self) -> Usage:
        last = self.events[-1]
        assert isinstance(last, Usage)
        return last


async def collect(stream: AsyncIterator[BackendEvent]) -> Result:
    events = [event async for event in stream]
    check_order(events)
    return Result(events)
