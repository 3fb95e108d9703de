"""``ChoiceText``: a choice's text into thought, content and tool calls, the thought split
off before calls are read (``backends.tool_markup.answer``)."""

from __future__ import annotations

from backends.base import ReasoningDelta, TextDelta, ToolCallDelta
from backends.reasoning import reasoning_format
from backends.tool_markup.answer import ChoiceText
from backends.tool_markup.parser import ToolCallParser

CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


def _run(choice: ChoiceText, pieces: list[str]) -> list[object]:
    events: list[object] = []
    for piece in pieces:
        events += choice.feed(piece, 1)
    tail, reason = choice.finish("stop")
    return [*events, *tail, reason]


def test_a_call_inside_the_thought_is_thought_and_one_after_it_a_call() -> None:
    thinking = reasoning_format("deepseek_r1").parser(in_thought=True)
    choice = ChoiceText(2, thinking, ToolCallParser(2))
    text = f"maybe {CALL}?</think>{CALL}"
    events = _run(choice, [text[i : i + 7] for i in range(0, len(text), 7)])
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert thought == f"maybe {CALL}?" and choice.thought == thought
    calls = [e for e in events if isinstance(e, ToolCallDelta)]
    assert calls[0].name == "f" and all(e.index == 2 for e in calls)
    assert "".join(e.arguments_fragment for e in calls) == '{"x": 1}'
    assert not any(isinstance(e, TextDelta) and e.text.strip() for e in events)
    assert events[-1] == "tool_calls"


def test_tokens_ride_on_the_first_event() -> None:
    thinking = reasoning_format("qwen3").parser()
    choice = ChoiceText(0, thinking, None)
    assert choice.feed("<think>a</think>b", 3) == [
        ReasoningDelta(0, "a", 3),
        TextDelta(0, "b", num_tokens=0),
    ]
    assert choice.thought_pieces == 1


def test_without_a_parser_it_is_all_answer() -> None:
    choice = ChoiceText(1, None, None)
    assert _run(choice, ["<think>a</think>"]) == [TextDelta(1, "<think>a</think>"), "stop"]
