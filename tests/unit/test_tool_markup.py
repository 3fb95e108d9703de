"""Hermes tool-call markup: rendering, and parsing a stream cut at any point."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.base import (
    ChatMessage,
    GenerationRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolSpec,
)
from backends.tool_markup.constraints import structured_outputs
from backends.tool_markup.markup import render_call
from backends.tool_markup.parser import ToolCallParser
from backends.tool_markup.prompt import chat_messages
from backends.triton.contract import sampling_json

ARGS = '{"city": "Os\\"lo", "n": [1, {"a": "}"}]}'


CALL = '<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + "}\n</tool_call>"


def parse(text: str, step: int) -> tuple[str, list[tuple[str, str]]]:
    """Feed ``text`` in pieces of ``step`` characters; (content, [(name, arguments)])."""
    parser = ToolCallParser(0)
    pieces: list[str | ToolCallDelta] = []
    for start in range(0, len(text), step):
        pieces += parser.feed(text[start : start + step])
    pieces += parser.flush()
    content = "".join(p for p in pieces if isinstance(p, str))
    calls: dict[int, list[str]] = {}
    for piece in pieces:
        if isinstance(piece, ToolCallDelta):
            entry = calls.setdefault(piece.call_index, ["", ""])
            if piece.id is not None:
                assert piece.id.startswith("call_") and piece.name
                assert not entry[0], "a call is named once, in its first delta"
                entry[0] = piece.name
            entry[1] += piece.arguments_fragment
    return content, [(name, args) for name, args in calls.values()]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_calls_and_content_split_at_any_point(step: int) -> None:
    text = "Let me check. " + CALL + "\n" + CALL.replace("get_weather", "noop")
    content, calls = parse(text, step)
    assert content == "Let me check. "
    assert calls == [("get_weather", ARGS), ("noop", ARGS)]
    assert json.loads(calls[0][1])["n"][1] == {"a": "}"}


@pytest.mark.parametrize("step", [1, 5])
def test_plain_text_and_near_markers_pass_through(step: int) -> None:
    text = "a < b and <tool_cal is not a call; <tool_x> neither"
    assert parse(text, step) == (text, [])


def test_keys_in_another_order_are_parsed_whole() -> None:
    text = '<tool_call>{"arguments": {"x": 1}, "name": "f"}</tool_call>'
    assert parse(text, 4) == ("", [("f", '{"x": 1}')])


def test_unparseable_markup_stays_content() -> None:
    text = "<tool_call>not json</tool_call>"
    assert parse(text, 3) == (text, [])


def test_a_cut_inside_a_marker_drops_it() -> None:
    parser = ToolCallParser(0)
    assert parser.feed("done <tool") == ["done "]
    assert parser.flush(cut=True) == []


def test_template_without_tools_gets_a_system_prompt_and_markup() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    request = GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=4),
        messages=(
            ChatMessage("user", "weather?"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "sunny", tool_call_id="call_1"),
        ),
        tools=(ToolSpec("get_weather", "weather", '{"type": "object"}'),),
        tool_choice=ToolChoice("auto"),
    )
    system, user, assistant, tool = chat_messages(request, template_takes_tools=False)
    assert system["role"] == "system" and '"name": "get_weather"' in system["content"]
    assert user == {"role": "user", "content": "weather?"}
    assert assistant == {"role": "assistant", "content": render_call(call)}
    assert tool["role"] == "user" and "sunny" in tool["content"]
    hf = chat_messages(request, template_takes_tools=True)
    assert hf[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert hf[2]["tool_call_id"] == "call_1"


def test_constraints_map_onto_vllm_structured_outputs() -> None:
    base = GenerationRequest(
        request_id="r", model="m", kind=RequestKind.CHAT, sampling=SamplingParams(max_tokens=4)
    )
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert structured_outputs(base) is None
    as_object = replace(base, response_format=ResponseFormat("json_object"))
    assert structured_outputs(as_object) == {"json_object": True}
    as_schema = replace(base, response_format=ResponseFormat("json_schema", "s", schema))
    assert structured_outputs(as_schema) == {"json": schema}
    object_schema = replace(base, response_format=ResponseFormat("json_object", schema=schema))
    assert structured_outputs(object_schema) == {"json": schema}
    tools = (ToolSpec("f", None, schema), ToolSpec("g"))
    named = replace(base, tools=tools, tool_choice=ToolChoice("named", "g"))
    found = structured_outputs(named)
    assert found is not None
    tag = json.loads(found["structural_tag"])["format"]
    assert tag["type"] == "tags_with_separator" and tag["at_least_one"]
    assert [t["begin"] for t in tag["tags"]] == ['<tool_call>\n{"name": "g", "arguments": ']
    sent = json.loads(sampling_json(SamplingParams(max_tokens=4), found))
    assert json.loads(sent["structured_outputs"]) == found
    auto = structured_outputs(replace(base, tools=tools))
    assert auto is not None
    assert json.loads(auto["structural_tag"])["format"]["type"] == "triggered_tags"


class _Template:
    """A tokenizer stand-in: its template text, and the arguments it was rendered with."""

    chat_template = "{% if enable_thinking %}{% endif %}{{ m.reasoning_content }}"

    def __init__(self) -> None:
        self.seen: tuple[list[dict[str, object]], dict[str, object]] | None = None

    def apply_chat_template(self, messages: list[dict[str, object]], **kwargs: object) -> str:
        self.seen = (messages, kwargs)
        return "prompt"


def test_reasoning_controls_and_earlier_thoughts_reach_the_template() -> None:
    from backends.base import ReasoningControls
    from backends.tool_markup.prompt import render_chat

    controls = ReasoningControls(thinking=False, template_kwargs='{"tokenize": true, "custom": 1}')
    request = GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=4),
        messages=(
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "hello", reasoning="they greet me"),
            ChatMessage("user", "again"),
        ),
        reasoning=controls,
    )
    tokenizer = _Template()
    assert render_chat(tokenizer, request) == "prompt"
    assert tokenizer.seen is not None
    messages, kwargs = tokenizer.seen
    assert messages[1] == {
        "role": "assistant",
        "content": "hello",
        "reasoning_content": "they greet me",
    }
    assert "reasoning_content" not in messages[0]
    # The switch the template reads, the client's own variables, never a render argument.
    assert kwargs["enable_thinking"] is False and kwargs["custom"] == 1
    assert kwargs["tokenize"] is False
