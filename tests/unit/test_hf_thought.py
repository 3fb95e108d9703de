"""``ChoiceThought``, the hf engine's view of one choice's thought: which tokens count as
thought, when the closing is forced (a budget spent, or room left only for the closing
and the shortest answer), and what an undecided choice may open. Pure: made-up token
ids over the real parsers."""

from __future__ import annotations

from dataclasses import replace

from backends.hf.engine.thought import ChoiceThought, ThoughtMarkup
from backends.reasoning import Phase, reasoning_format

SHORT = ThoughtMarkup(reasoning_format("qwen3"), (9,), (8,), None, None, False)
LONG = replace(SHORT, closing_ids=(5, 6, 7), opening_ids=(1, 2, 3))


def test_thought_tokens_include_the_opening_and_the_closing() -> None:
    thought = ChoiceThought.start(SHORT, in_thought=False, budget=None)
    counts = []
    for text in (" ", "<think>", "hmm", "</think>", "yes"):
        thought.read(text, final=False)
        counts.append((thought.phase, thought.tokens))
    assert counts == [
        (Phase.UNDECIDED, 0),  # leading whitespace: nothing decided yet
        (Phase.THINKING, 1),
        (Phase.THINKING, 2),
        (Phase.ANSWERING, 3),
        (Phase.ANSWERING, 3),
    ]


def test_a_prompt_that_opened_the_thought_counts_from_the_first_token() -> None:
    thought = ChoiceThought.start(SHORT, in_thought=True, budget=None)
    split = thought.read("so</think>answer", final=True)
    assert (split.reasoning, split.content, thought.tokens) == ("so", "answer", 1)


def test_a_spent_budget_forces_the_whole_closing() -> None:
    thought = ChoiceThought.start(LONG, in_thought=True, budget=5)
    thought.read("one", final=False)
    thought.plan_closing(left=100, reserve=None)
    assert not thought.forcing  # 1 + 3 closing tokens is 4: one more thought token fits
    thought.read("two", final=False)
    thought.plan_closing(left=100, reserve=None)
    assert thought.plan == [5, 6, 7]
    assert [thought.take_forced(t) for t in (5, 6, 7)] == [True, True, True]
    assert not thought.forcing


def test_the_closing_comes_while_the_shortest_answer_still_fits() -> None:
    thought = ChoiceThought.start(LONG, in_thought=True, budget=None)
    thought.plan_closing(left=10, reserve=6)
    assert not thought.forcing
    thought.plan_closing(left=9, reserve=6)
    assert thought.plan == [5, 6, 7]


def test_no_closing_that_cannot_fit_whole_and_none_for_a_free_answer() -> None:
    thought = ChoiceThought.start(LONG, in_thought=True, budget=1)
    thought.plan_closing(left=2, reserve=None)
    assert not thought.forcing  # max_tokens will cut the thought instead
    free = ChoiceThought.start(LONG, in_thought=True, budget=None)
    free.plan_closing(left=3, reserve=None)
    assert not free.forcing
    answering = ChoiceThought.start(LONG, in_thought=False, budget=0)
    answering.read("plain", final=False)
    answering.plan_closing(left=100, reserve=None)
    assert answering.phase is Phase.ANSWERING and not answering.forcing


def test_an_undecided_choice_may_open_its_thought() -> None:
    thought = ChoiceThought.start(LONG, in_thought=False, budget=None)
    assert thought.next_opening() == 1
    thought.chose(1, grammar_took=True)  # the grammar allows it too: nothing forced yet
    assert thought.next_opening() == 2 and not thought.forcing
    thought.chose(2, grammar_took=False)  # only the opening allows it: the rest is forced
    assert thought.plan == [3] and thought.next_opening() is None
    other = ChoiceThought.start(LONG, in_thought=False, budget=None)
    other.chose(1, grammar_took=True)
    other.chose(4, grammar_took=True)  # not the opening after all
    assert other.next_opening() == 1
