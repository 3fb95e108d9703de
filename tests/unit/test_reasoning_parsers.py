"""The reasoning parsers (``backends.reasoning``): what each splits off as thought, and
that any cut of a stream into deltas splits it as one delta does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import ReasoningControls
from backends.reasoning import (
    FORMATS,
    PARSER_NAMES,
    Phase,
    Split,
    detect_format,
    reasoning_format,
    template_kwargs,
    template_switch,
)

ANALYSIS = "<|channel|>analysis<|message|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>"

# (parser, in_thought, output, expected thought, expected answer)
CASES: list[tuple[str, bool | None, str, str, str]] = [
    # DeepSeek-R1: its template opens <think>, so what precedes </think> is thought.
    ("deepseek_r1", None, "Let me see.\n</think>\n\nParis.", "Let me see.\n", "\n\nParis."),
    ("deepseek_r1", None, "<think>hm</think>Paris", "hm", "Paris"),
    ("deepseek_r1", None, "\n<think>hm</think>Paris", "hm", "Paris"),
    ("deepseek_r1", None, "never closed <think> at all", "never closed <think> at all", ""),
    ("deepseek_r1", None, "</think>only answer", "", "only answer"),
    ("deepseek_r1", None, "<think></think>", "", ""),
    ("deepseek_r1", None, "", "", ""),
    ("deepseek_r1", None, "a</think>b</think>c", "a", "b</think>c"),
    ("deepseek_r1", False, "plain answer", "", "plain answer"),
    ("deepseek_r1", False, "<think>x</think>y", "x", "y"),
    # Qwen3: a thought only between explicit tags at the start; no tag, all answer.
    ("qwen3", None, "<think>\nhm\n</think>\n\nParis.", "\nhm\n", "\n\nParis."),
    ("qwen3", None, "Paris, no thought.", "", "Paris, no thought."),
    ("qwen3", None, "Paris <think>x</think>", "", "Paris <think>x</think>"),
    ("qwen3", None, "<think>cut short", "cut short", ""),
    ("qwen3", None, "<think></think>answer", "", "answer"),
    ("qwen3", None, "  \n", "", "  \n"),
    ("qwen3", None, "<thin", "", "<thin"),
    ("qwen3", True, "opened by the prompt</think>answer", "opened by the prompt", "answer"),
    ("mistral", None, "[THINK]hm[/THINK]ok", "hm", "ok"),
    ("mistral", None, "ok [THINK]", "", "ok [THINK]"),
    # Granite: plain-text headings; "Here's" counts too; no heading first, no thought.
    (
        "granite",
        None,
        "Here is my thought process: a, b. Here is my response: c",
        " a, b. ",
        " c",
    ),
    ("granite", None, "Here's my thought process:x Here's my response:y", "x ", "y"),
    ("granite", None, "Here is my thought process: never answered", " never answered", ""),
    ("granite", None, "Just so. Here is my response: z", "", "Just so. Here is my response: z"),
    ("granite", None, "Here", "", "Here"),
    # gpt-oss: harmony channels.
    ("openai_gptoss", None, f"{ANALYSIS}think<|end|>{FINAL}Paris<|return|>", "think", "Paris"),
    ("openai_gptoss", None, f"{ANALYSIS}cut", "cut", ""),
    ("openai_gptoss", None, "no harmony here", "", "no harmony here"),
    ("openai_gptoss", None, f"{ANALYSIS}<|end|>{FINAL}x", "", "x"),
    (
        "openai_gptoss",
        None,
        f"{ANALYSIS}a<|end|><|start|>assistant<|channel|>commentary to=functions.f "
        "<|constrain|>json<|message|>{}<|call|>",
        "a",
        "{}",
    ),
    ("openai_gptoss", True, f"from the prompt<|end|>{FINAL}ok", "from the prompt", "ok"),
]


def run(name: str, in_thought: bool | None, deltas: list[str]) -> tuple[str, str]:
    parser = reasoning_format(name).parser(in_thought=in_thought)
    thought, answer = [], []
    for delta in deltas:
        split = parser.feed(delta)
        thought.append(split.reasoning)
        answer.append(split.content)
    last = parser.finish()
    return "".join(thought) + last.reasoning, "".join(answer) + last.content


@pytest.mark.parametrize(("name", "in_thought", "output", "thought", "answer"), CASES)
def test_split_whole(
    name: str, in_thought: bool | None, output: str, thought: str, answer: str
) -> None:
    assert run(name, in_thought, [output]) == (thought, answer)


@pytest.mark.parametrize(("name", "in_thought", "output", "thought", "answer"), CASES)
def test_split_character_by_character(
    name: str, in_thought: bool | None, output: str, thought: str, answer: str
) -> None:
    assert run(name, in_thought, list(output)) == (thought, answer)


@pytest.mark.parametrize(("name", "in_thought", "output", "thought", "answer"), CASES)
def test_every_two_way_cut(
    name: str, in_thought: bool | None, output: str, thought: str, answer: str
) -> None:
    for at in range(len(output) + 1):
        assert run(name, in_thought, [output[:at], output[at:]]) == (thought, answer), at


MARKUP = [
    *("<think>", "</think>", "[THINK]", "[/THINK]", "<|channel|>", "<|message|>", "<|end|>"),
    *("<|start|>", "<|return|>", "analysis", "final", "Here is my ", "thought process:"),
    *("response:", "Here's", "<", "</", "|", " ", "\n", "a", "xyz"),
]


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(PARSER_NAMES),
    in_thought=st.sampled_from([None, True, False]),
    pieces=st.lists(st.sampled_from(MARKUP), max_size=14),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_any_cut_splits_as_one_delta(
    name: str, in_thought: bool | None, pieces: list[str], cuts: list[int]
) -> None:
    output = "".join(pieces)
    points = sorted({min(cut, len(output)) for cut in cuts})
    deltas = [output[a:b] for a, b in zip([0, *points], [*points, len(output)], strict=True)]
    whole = run(name, in_thought, [output])
    assert run(name, in_thought, deltas) == whole
    # Nothing is lost or made up: thought and answer are the output less its markers.
    assert len(whole[0]) + len(whole[1]) <= len(output)


def test_markers_are_held_back_until_decided() -> None:
    parser = reasoning_format("deepseek_r1").parser()
    assert parser.feed("a</th") == Split("a", "")
    assert parser.phase is Phase.THINKING
    assert parser.feed("ink>b") == Split("", "b")
    assert parser.phase is Phase.ANSWERING
    assert not parser.finish()


def test_phase_of_a_tag_parser() -> None:
    parser = reasoning_format("qwen3").parser()
    assert parser.phase is Phase.UNDECIDED
    parser.feed("<think>")
    assert parser.phase is Phase.THINKING
    parser.feed("x</think>")
    assert parser.phase is Phase.ANSWERING


def test_phase_of_harmony() -> None:
    parser = reasoning_format("openai_gptoss").parser()
    parser.feed(ANALYSIS + "x")
    assert parser.phase is Phase.THINKING
    parser.feed("<|end|>" + FINAL)
    assert parser.phase is Phase.ANSWERING


@pytest.mark.parametrize("name", PARSER_NAMES)
def test_forcing_the_closing_ends_a_thought(name: str) -> None:
    """What an engine forces at a spent budget closes the thought, the answer follows."""
    fmt = reasoning_format(name)
    assert run(name, True, ["so far", fmt.closing, "the answer"]) == ("so far", "the answer")


def test_unknown_parser_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="deepseek_r1"):
        reasoning_format("nope")


def test_every_name_has_a_format() -> None:
    assert set(FORMATS) == set(PARSER_NAMES)


def test_starts_in_thought_reads_the_prompt() -> None:
    r1, qwen = reasoning_format("deepseek_r1"), reasoning_format("qwen3")
    assert r1.starts_in_thought()
    assert not qwen.starts_in_thought()
    assert qwen.starts_in_thought("<|im_start|>assistant\n<think>\n")
    assert not r1.starts_in_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert r1.starts_in_thought("<|im_start|>assistant\n")  # R1's default
    assert not r1.starts_in_thought(None, thinking=False)
    assert reasoning_format("openai_gptoss").starts_in_thought("...<|start|>assistant" + ANALYSIS)


R1_TEMPLATE = (
    "{% for m in messages %}{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|Assistant|><think>\\n' }}{% endif %}"
)
QWEN3_TEMPLATE = (
    "{%- for m in messages %}{{ m.content }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def test_template_opens_thought() -> None:
    assert reasoning_format("deepseek_r1").template_opens_thought(R1_TEMPLATE)
    assert not reasoning_format("qwen3").template_opens_thought(QWEN3_TEMPLATE)
    assert not reasoning_format("deepseek_r1").template_opens_thought("{{ x }}")


@pytest.mark.parametrize(
    ("template", "tokens", "expected"),
    [
        (R1_TEMPLATE, [], "deepseek_r1"),
        (QWEN3_TEMPLATE, ["<think>", "</think>"], "qwen3"),
        ("{{ x }}", ["<think>", "</think>"], "deepseek_r1"),
        ("{{ x }}", ["<think>"], None),
        ("{{ '<|start|>assistant' }}", ["<|channel|>", "<|message|>"], "openai_gptoss"),
        ("{{ '[THINK]' }}", [], "mistral"),
        ("Here is my thought process: ... {% if thinking %}{% endif %}", [], "granite"),
        ("{{ messages }}", ["<|im_start|>"], None),
        (None, [], None),
    ],
)
def test_detect_format(template: str | None, tokens: list[str], expected: str | None) -> None:
    assert detect_format(template, tokens) == expected


def test_template_kwargs() -> None:
    off = ReasoningControls(thinking=False)
    assert template_switch(QWEN3_TEMPLATE) == "enable_thinking"
    assert template_kwargs(QWEN3_TEMPLATE, off) == {"enable_thinking": False}
    assert template_switch("{% if thinking %}x{% endif %}") == "thinking"
    assert template_switch("a thinking model {{ x }}") is None  # a word, not a variable
    assert template_kwargs(R1_TEMPLATE, off) == {}
    gptoss = "{{ reasoning_effort | default('medium') }}"
    assert template_kwargs(gptoss, ReasoningControls(effort="high")) == {"reasoning_effort": "high"}
    client = ReasoningControls(thinking=False, template_kwargs='{"enable_thinking": true}')
    assert template_kwargs(QWEN3_TEMPLATE, client) == {"enable_thinking": True}
