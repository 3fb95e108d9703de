"""The reasoning formats llmso knows, by vLLM's parser names, and how to tell them apart.

A ``ReasoningFormat`` is what one model family writes: the marker opening a thought, the
text closing it (what an engine forces when a thinking budget is spent), whether the
model's output starts inside a thought when nothing says otherwise, and a fresh
``ReasoningParser`` per choice. ``detect_format`` picks one from a chat template and a
tokenizer's special tokens (``reasoning_parser: auto``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from backends.reasoning import granite, harmony
from backends.reasoning.granite import GraniteParser
from backends.reasoning.harmony import HarmonyParser
from backends.reasoning.scanner import ReasoningParser
from backends.reasoning.tags import TagParser

ParserName = Literal["deepseek_r1", "qwen3", "granite", "openai_gptoss", "mistral"]
PARSER_NAMES: tuple[ParserName, ...] = get_args(ParserName)


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """One family's thought markup. ``opening`` opens a thought (in the output or at the
    end of a prompt); ``closing`` ends it and opens the answer; ``thinks_first``: with no
    evidence from the prompt, the output starts inside a thought (DeepSeek-R1's template
    opens ``<think>`` itself, so its output often has no opening tag)."""

    name: ParserName
    opening: str
    closing: str
    thinks_first: bool
    _build: Callable[[bool], ReasoningParser]

    def parser(self, *, in_thought: bool | None = None) -> ReasoningParser:
        """A parser for one choice; ``in_thought`` from ``starts_in_thought``."""
        return self._build(self.thinks_first if in_thought is None else in_thought)

    def prompt_state(self, prompt: str) -> bool | None:
        """What a rendered prompt says of the thought: True when it ends inside an open
        one (the template opened it), False when it ends right after a closed one (the
        template switched thinking off, as Qwen3's does), None when it says neither."""
        tail = prompt.rstrip()
        if tail.endswith(self.opening):
            return True
        if tail.endswith(self.closing.rstrip()):
            return False
        return None

    def starts_in_thought(self, prompt: str | None = None, thinking: bool | None = None) -> bool:
        """Whether a choice's output starts inside a thought: as the rendered ``prompt``
        says where it says, else not when the client switched ``thinking`` off, else
        ``thinks_first``."""
        state = self.prompt_state(prompt) if prompt is not None else None
        if state is not None:
            return state
        if thinking is False:
            return False
        return self.thinks_first

    def template_opens_thought(self, template: str) -> bool:
        """Whether a chat template opens the thought in its generation prompt (the text
        after its last ``add_generation_prompt`` holds ``opening`` not closed after it):
        DeepSeek-R1's and QwQ's do, Qwen3's (which opens and closes it only with
        thinking off) does not."""
        at = template.rfind("add_generation_prompt")
        tail = template[at:] if at >= 0 else ""
        opened = tail.rfind(_escaped(self.opening))
        return opened >= 0 and tail.find(_escaped(self.closing), opened) < 0


def _escaped(marker: str) -> str:
    """A marker as a Jinja string literal spells it (``\\n`` stays two characters)."""
    return marker.replace("\n", "\\n")


def _tags(open_tag: str, close_tag: str) -> Callable[[bool], ReasoningParser]:
    return lambda in_thought: TagParser(open_tag, close_tag, in_thought=in_thought)


FORMATS: dict[str, ReasoningFormat] = {
    fmt.name: fmt
    for fmt in (
        ReasoningFormat("deepseek_r1", "<think>", "</think>", True, _tags("<think>", "</think>")),
        ReasoningFormat("qwen3", "<think>", "</think>", False, _tags("<think>", "</think>")),
        ReasoningFormat("mistral", "[THINK]", "[/THINK]", False, _tags("[THINK]", "[/THINK]")),
        ReasoningFormat(
            "granite",
            granite.THOUGHT_HEADINGS[0],
            granite.RESPONSE_HEADINGS[0],
            False,
            lambda in_thought: GraniteParser(in_thought=in_thought),
        ),
        ReasoningFormat(
            "openai_gptoss",
            harmony.THOUGHT_OPENING,
            harmony.ANSWER_OPENING,
            False,
            lambda in_thought: HarmonyParser(in_thought=in_thought),
        ),
    )
}


def reasoning_format(name: str) -> ReasoningFormat:
    """The format of parser ``name``; ``ValueError`` naming the known ones otherwise."""
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(PARSER_NAMES)}")
    return fmt


def detect_format(template: str | None, special_tokens: Iterable[str]) -> ParserName | None:
    """The parser for a model, from its chat template text and its tokenizer's special
    (added) tokens; None when neither shows a known format. Harmony's channel marker,
    Magistral's ``[THINK]``, Granite's thought heading, then think tags: ``qwen3`` when
    the template has Qwen3's ``enable_thinking`` switch, else ``deepseek_r1``. Think tags
    count in the template, or as a pair of special tokens."""
    text = template or ""
    tokens = set(special_tokens)
    if harmony.CHANNEL in tokens or harmony.CHANNEL in text:
        return "openai_gptoss"
    if "[THINK]" in tokens or "[THINK]" in text:
        return "mistral"
    if any(heading in text for heading in granite.THOUGHT_HEADINGS):
        return "granite"
    tagged = "<think>" in text or "</think>" in text or {"<think>", "</think>"} <= tokens
    if not tagged:
        return None
    return "qwen3" if template_reads(text, "enable_thinking") else "deepseek_r1"


def template_reads(template: str, name: str) -> bool:
    """Whether a Jinja template uses the variable ``name`` inside a tag or expression
    (not merely as a word of its text)."""
    pattern = rf"\{{[{{%][^}}]*?(?<![\w.]){re.escape(name)}(?!\w)"
    return re.search(pattern, template) is not None
