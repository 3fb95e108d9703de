"""The fixed prompt set: deterministic, varied lengths, identical for every system compared.

Prompts are built from a short list of questions and a block of context sentences; prompt
``i`` gets ``CONTEXT_SIZES[i % len(CONTEXT_SIZES)]`` sentences of context, so a run mixes
short, medium and long prompts in a fixed order. ``--prompts FILE`` replaces them with a
JSON-lines file (one ``{"prompt": "..."}`` object or a bare string per line).

The shared-prefix workload (``shared_prefix_prompts``) starts every prompt with the same
~1,000-token block of instructions and ends it with a short question that differs per
prompt: what a chat service with one long system prompt sends, and what prefix caching
is for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_QUESTIONS: tuple[str, ...] = (
    "Explain how a hash table handles collisions.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What are the main differences between TCP and UDP?",
    "Summarise the water cycle for a ten-year-old.",
    "List five tips for writing readable Python code.",
    "Describe how a bicycle gear system works.",
    "Why is the sky blue? Give a simple explanation.",
    "Write a polite email asking a colleague to review a pull request.",
    "Compare baking bread with a sourdough starter and with dry yeast.",
    "How does a binary search work, and when should it be used?",
    "Give a recipe for a simple vegetable soup.",
    "What is the role of a scheduler in an operating system?",
)

_CONTEXT: tuple[str, ...] = (
    "The following notes come from a study group that meets every Tuesday evening.",
    "Members take turns preparing a topic and presenting it in plain language.",
    "Questions are collected on a whiteboard and answered at the end of the session.",
    "Good answers are short, concrete and use an example the whole group can follow.",
    "The group prefers explanations that start from first principles.",
    "Last week the discussion ran long, so this week answers should stay focused.",
    "Everyone agreed that jargon should be defined the first time it appears.",
    "A volunteer writes the final answer into the shared notebook afterwards.",
)

# Sentences of context per prompt, cycled: short, long, medium, very long, none, medium.
CONTEXT_SIZES: tuple[int, ...] = (1, 8, 3, 16, 0, 5)


# Rules of a fictional help desk; 46 of them (cycled, numbered) make the shared prefix.
_RULES: tuple[str, ...] = (
    "Greet the customer by name when the name is known, and keep the greeting short.",
    "Never promise a delivery date that the warehouse system has not confirmed.",
    "Refunds under fifty euros may be approved directly; larger ones need a supervisor.",
    "Ask for the order number before discussing the details of any order.",
    "Do not share one customer's data with another person, even a family member.",
    "When a product is out of stock, offer the closest alternative and a restock alert.",
    "Escalate any report of a safety problem with a product to the quality team at once.",
    "Use plain words; explain technical terms the first time they appear.",
)
SHARED_PREFIX_RULES = 46


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt, sent as a single user message (chat) or as raw text (completions)."""

    index: int
    text: str


def builtin_prompts(count: int) -> tuple[Prompt, ...]:
    """``count`` deterministic prompts of varied lengths (the same on every call)."""
    if count < 1:
        raise ValueError("count must be >= 1")
    prompts = []
    for i in range(count):
        size = CONTEXT_SIZES[i % len(CONTEXT_SIZES)]
        context = " ".join(_CONTEXT[(i + k) % len(_CONTEXT)] for k in range(size))
        question = _QUESTIONS[i % len(_QUESTIONS)]
        text = f"{context}\n\n{question}" if context else question
        prompts.append(Prompt(index=i, text=text))
    return tuple(prompts)


def shared_prefix() -> str:
    """The common instructions (~1,000 SmolLM2 tokens) every shared-prefix prompt starts with."""
    lines = [f"Rule {k + 1}: {_RULES[k % len(_RULES)]}" for k in range(SHARED_PREFIX_RULES)]
    return "You are the help desk assistant of an online shop.\n" + "\n".join(lines)


def shared_prefix_prompts(count: int) -> tuple[Prompt, ...]:
    """``count`` prompts: the shared instructions, then a short question unique to each."""
    if count < 1:
        raise ValueError("count must be >= 1")
    head = shared_prefix()
    return tuple(
        Prompt(index=i, text=f"{head}\n\nCustomer {i + 1} asks: {_QUESTIONS[i % len(_QUESTIONS)]}")
        for i in range(count)
    )


def load_prompts(path: Path) -> tuple[Prompt, ...]:
    """Prompts from a JSON-lines file: ``{"prompt": str}`` objects or bare JSON strings."""
    prompts: list[Prompt] = []
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        value = json.loads(raw)
        if isinstance(value, dict):
            value = value.get("prompt")
        if not isinstance(value, str) or not value:
            raise ValueError(f"{path}:{lineno}: expected a string or an object with 'prompt'")
        prompts.append(Prompt(index=len(prompts), text=value))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return tuple(prompts)
