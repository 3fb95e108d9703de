"""A reasoning model on the hf engine: the tiny random Qwen3 of ``tests.tools.reasoning_model``
(SmolLM2's byte-level tokenizer with ``<think>`` and ``</think>`` added, a chat template
that opens the thought as DeepSeek-R1's does), served with ``reasoning_parser:
deepseek_r1``, with ``auto``, and (``TestHFReasoningContract``) under a template that
thinks only when ``enable_thinking`` asks, which ``auto`` takes for ``qwen3``.

Random weights never close a thought on their own. The tests make them close it with
what the product offers, nothing added for tests: a thinking budget (the engine forces
``</think>`` once it is spent), or a constrained answer that must still close within
``max_tokens`` (the engine forces ``</think>`` while the shortest value still fits).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import torch

from backends.base import (
    Backend,
    Feature,
    GenerationRequest,
    ReasoningControls,
    ReasoningDelta,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    ToolChoice,
    ToolSpec,
)
from backends.hf.backend import HFBackend
from backends.hf.constrained.grammar import GrammarBook
from backends.hf.engine.detokenizer import TokenTable
from backends.hf.engine.outputs import StepOutputs, accept_token
from backends.hf.engine.sampler import sample
from backends.hf.engine.sequence import RequestState, make_choices
from backends.hf.engine.thought import resolve
from backends.reasoning import Phase
from backends.tool_markup.prompt import render_chat
from tests.contract.events import Result
from tests.hf.engine_contract import EngineContract
from tests.hf.helpers import RecordingObserver, chat, check_order, collect, config
from tests.tools.engines import model_folder
from tests.tools.reasoning_model import SWITCHED_TEMPLATE, build

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "big": {"type": "boolean"}},
    "required": ["city", "big"],
    "additionalProperties": False,
}
MARKERS = ("<think>", "</think>")


def ask(
    text: str = "Why is the sky blue?",
    max_tokens: int = 16,
    *,
    budget: int | None = None,
    thinking: bool | None = None,
    **sampling: Any,
) -> GenerationRequest:
    controls = ReasoningControls(thinking=thinking, budget_tokens=budget)
    return replace(chat(text, max_tokens, **sampling), reasoning=controls)


def as_json(request: GenerationRequest) -> GenerationRequest:
    return replace(request, response_format=ResponseFormat("json_schema", name="c", schema=SCHEMA))


def with_tool(request: GenerationRequest) -> GenerationRequest:
    tool = ToolSpec("get_city", "Look a city up.", SCHEMA)
    return replace(request, tools=(tool,), tool_choice=ToolChoice("required"))


def markers_apart(result: Result) -> None:
    """No marker in the thought or the answer."""
    for marker in MARKERS:
        assert marker not in result.thought() and marker not in result.text(), result.events


def split(result: Result) -> tuple[str, str, list[tuple[str, str]], int, int, str]:
    usage = result.usage
    return (
        result.thought(),
        result.text(),
        result.calls(),
        usage.completion_tokens,
        usage.reasoning_tokens,
        result.reason(),
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(model_folder(), tmp_path_factory.mktemp("thinker"))


@pytest.fixture(scope="module")
async def backend(folder: Path) -> AsyncIterator[HFBackend]:
    b = HFBackend(config(source=str(folder), reasoning_parser="deepseek_r1", max_num_seqs=8))
    await b.start()
    yield b
    await b.stop()


async def test_the_thought_comes_apart_from_the_answer(backend: HFBackend) -> None:
    features = backend.info().features
    assert {Feature.REASONING, Feature.THINKING_BUDGET} <= features
    # the template reads neither a switch nor an effort: both are refused by capability
    assert not {Feature.THINKING_SWITCH, Feature.REASONING_EFFORT} & features
    result = await collect(backend.generate(ask(budget=6)))
    check_order(result.events)
    assert result.thought().strip() and result.text().strip()
    markers_apart(result)
    kinds = [type(e) for e in result.events if isinstance(e, ReasoningDelta | TextDelta)]
    first_answer = kinds.index(TextDelta)
    assert ReasoningDelta not in kinds[first_answer:], kinds
    assert result.usage.reasoning_tokens == 6
    assert result.usage.completion_tokens == 16


async def test_a_thought_cut_by_max_tokens_is_all_thought(backend: HFBackend, folder: Path) -> None:
    """max_tokens counts the thought: cut inside it, the choice ends ``length`` with its
    thought and no answer, and the thought is the model's raw text (nothing dropped)."""
    request = ask(max_tokens=12)
    result = await collect(backend.generate(request))
    assert result.reason() == "length" and result.text() == ""
    assert result.usage.reasoning_tokens == result.usage.completion_tokens == 12
    from transformers import AutoTokenizer

    prompt = render_chat(AutoTokenizer.from_pretrained(folder), request)
    tokens = AutoTokenizer.from_pretrained(folder)(prompt, add_special_tokens=False)["input_ids"]
    raw = GenerationRequest(
        request_id="raw",
        model="smol",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=12, temperature=0.0),
        prompt_token_ids=tuple(tokens),
    )
    completion = await collect(backend.generate(raw))
    assert not any(isinstance(e, ReasoningDelta) for e in completion.events)
    assert completion.usage.reasoning_tokens == 0
    assert completion.text() == result.thought()


@pytest.mark.parametrize("budget", [5, None], ids=["thinking-budget", "max-tokens"])
async def test_json_after_a_thought_on_20_seeds(backend: HFBackend, budget: int | None) -> None:
    """``response_format`` json_schema on a thinking model: free text in the thought,
    valid JSON in the answer, on 20 seeds at temperature 0.7. The thought is closed by a
    budget of 5, or (no budget) where the shortest value still fits in max_tokens."""
    requests = [
        as_json(ask("Name a big city as JSON.", 40, budget=budget, temperature=0.7, seed=seed))
        for seed in range(20)
    ]
    results = await asyncio.gather(*(collect(backend.generate(r)) for r in requests))
    for result in results:
        assert result.reason() == "stop", result.events
        jsonschema.validate(orjson.loads(result.text()), SCHEMA)
        assert result.thought().strip()
        markers_apart(result)
        thought_tokens = result.usage.reasoning_tokens
        if budget is not None:
            assert thought_tokens == budget
        else:  # closed where the shortest value still fit
            assert 0 < thought_tokens < result.usage.completion_tokens
    assert len({r.thought() for r in results}) > 10  # sampled: the seeds think apart


@pytest.mark.parametrize("budget", [1, 2, 5, 9, 17])
async def test_a_thinking_budget_is_honoured(backend: HFBackend, budget: int) -> None:
    """The thought (closing included) takes ``budget`` tokens; the answer the rest."""
    result = await collect(backend.generate(ask(max_tokens=24, budget=budget)))
    assert result.usage.reasoning_tokens == budget
    assert result.usage.completion_tokens == 24 and result.text()
    assert bool(result.thought()) is (budget > 1)  # a budget of 1 is the closing alone
    markers_apart(result)


async def test_each_choice_keeps_its_own_budget(backend: HFBackend) -> None:
    result = await collect(backend.generate(ask(max_tokens=12, budget=4, n=2, temperature=1.0)))
    assert result.usage.reasoning_tokens == 8
    assert all(result.thought(i) and result.text(i) for i in (0, 1))


async def test_stop_strings_end_the_answer_not_the_thought(backend: HFBackend) -> None:
    whole = await collect(backend.generate(ask(max_tokens=24, budget=8)))
    in_thought = whole.thought().split()[1]
    in_answer = whole.text().split()[2]
    assert in_thought not in whole.text() and in_answer not in whole.thought()
    stops = (in_thought, in_answer)
    cut = await collect(backend.generate(ask(max_tokens=24, budget=8, stop=stops)))
    assert cut.thought() == whole.thought()  # its stop string did not end it
    assert cut.reason() == "stop" and whole.text().startswith(cut.text())
    assert cut.text() == whole.text()[: whole.text().index(in_answer)]


@pytest.mark.parametrize("budget", [4, None], ids=["thinking-budget", "max-tokens"])
async def test_a_required_tool_call_is_read_from_the_answer(
    backend: HFBackend, budget: int | None
) -> None:
    result = await collect(backend.generate(with_tool(ask("Look up Paris.", 64, budget=budget))))
    assert result.reason() == "tool_calls", result.events
    [(name, arguments)] = result.calls()
    assert name == "get_city"
    jsonschema.validate(orjson.loads(arguments), SCHEMA)
    assert result.thought().strip() and "<tool_call>" not in result.thought()
    assert not result.text().strip()
    markers_apart(result)


async def test_batched_equals_alone(backend: HFBackend) -> None:
    """Greedy: each request's split is the same alone and in a batch with others."""
    requests = [
        ask(budget=3),
        ask("Tell me a story.", 20, budget=8),
        as_json(ask("Name a city as JSON.", 30, budget=4)),
        with_tool(ask("Look up Rome.", 48, budget=5)),
        ask("Count to ten.", 10),
        replace(ask(budget=6), sampling=SamplingParams(max_tokens=14, temperature=0.0, n=2)),
    ]
    alone = [split(await collect(backend.generate(r))) for r in requests]
    together = await asyncio.gather(*(collect(backend.generate(r)) for r in requests))
    assert [split(r) for r in together] == alone


async def test_static_scheduling_splits_alike(backend: HFBackend, folder: Path) -> None:
    requests = [ask(budget=5), as_json(ask("Name a city as JSON.", 30, budget=4))]
    expected = [split(await collect(backend.generate(r))) for r in requests]
    static = HFBackend(
        config(
            source=str(folder),
            reasoning_parser="deepseek_r1",
            scheduling="static",
            batch_window_ms=0,
        )
    )
    await static.start()
    try:
        assert [split(await collect(static.generate(r))) for r in requests] == expected
    finally:
        await static.stop()


async def test_auto_finds_the_parser_in_the_template(
    backend: HFBackend, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="backends.hf.engine.thought")
    auto = HFBackend(config(source=str(folder), reasoning_parser="auto"))
    await auto.start()
    try:
        assert backend.info().features == auto.info().features
        request = ask(budget=5)
        assert split(await collect(auto.generate(request))) == split(
            await collect(backend.generate(request))
        )
    finally:
        await auto.stop()
    assert "reasoning parser deepseek_r1 (detected)" in caplog.text


async def test_no_parser_leaves_the_text_whole(folder: Path) -> None:
    plain = HFBackend(config(source=str(folder), reasoning_parser=None))
    await plain.start()
    try:
        assert Feature.REASONING not in plain.info().features
        result = await collect(plain.generate(ask(max_tokens=8)))
        assert result.text() and result.usage.reasoning_tokens == 0
        assert not any(isinstance(e, ReasoningDelta) for e in result.events)
    finally:
        await plain.stop()


async def test_markers_that_are_special_tokens_still_split(
    backend: HFBackend, tmp_path: Path
) -> None:
    """A tokenizer whose markers are special tokens (harmony's are): the engine keeps
    them in the text its parser reads, so the split is the same."""
    folder = build(model_folder(), tmp_path / "special", special=True)
    special = HFBackend(config(source=str(folder), reasoning_parser="auto"))
    await special.start()
    try:
        request = ask(budget=5)
        assert split(await collect(special.generate(request))) == split(
            await collect(backend.generate(request))
        )
    finally:
        await special.stop()


def test_an_undecided_choice_may_open_a_thought_the_grammar_forbids(folder: Path) -> None:
    """A ``qwen3`` choice may open its thought or answer at once: while it has not decided,
    the grammar's tokens and the opening are allowed. Opened, the thought is free text;
    its budget spent, ``</think>`` is forced; then the grammar holds the answer. Driven
    with logits that prefer one token each step, over the real tokenizer and grammar."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = SWITCHED_TEMPLATE
    markup = resolve("thinker", "auto", tokenizer)
    assert markup is not None and markup.format.name == "qwen3"
    eos = int(tokenizer.eos_token_id)
    book = GrammarBook(tokenizer, vocab_size=len(tokenizer), stop_ids=[eos])
    request = as_json(ask("Name a city as JSON.", 40, budget=3))
    grammar = book.compile(request)
    assert grammar is not None
    table = TokenTable(tokenizer)
    think, close = markup.opening_ids[0], markup.closing_ids[0]
    word = tokenizer("Hello", add_special_tokens=False)["input_ids"][0]
    brace = tokenizer("{", add_special_tokens=False)["input_ids"][0]

    def start() -> tuple[RequestState, StepOutputs]:
        state = RequestState(
            request=request,
            sink=None,
            prompt_ids=[1, 2, 3],
            max_tokens=40,
            queued_at=0.0,
            eos_ids=frozenset({eos}),
            grammar=grammar,
            in_thought=False,
        )
        make_choices(state, tokenizer, torch.device("cpu"), markup)
        return state, []

    def step(state: RequestState, out: StepOutputs, preferred: int) -> int:
        logits = torch.zeros(1, len(tokenizer))
        logits[0, preferred] = 10.0
        [(token, _)] = sample(logits, state.choices, table)
        accept_token(state.choices[0], token, None, out)
        return int(token)

    state, out = start()
    thought = state.choices[0].thought
    assert thought is not None and thought.phase is Phase.UNDECIDED
    assert step(state, out, think) == think and thought.phase is Phase.THINKING
    assert step(state, out, word) == word  # free while thinking
    assert step(state, out, word) == close and thought.phase is Phase.ANSWERING  # budget 3
    assert tokenizer.decode([step(state, out, word)]).startswith("{")  # the grammar holds
    events = Result([event for _, event in out])
    assert events.thought() == "Hello" and events.text().startswith("{")
    assert thought.tokens == 3

    state, out = start()  # the model answers at once: the grammar reads it from the start
    assert step(state, out, brace) == brace
    assert state.choices[0].thought.phase is Phase.ANSWERING  # type: ignore[union-attr]
    assert step(state, out, word) != word and step(state, out, think) != think


class TestHFReasoningContract(EngineContract):
    """The shared backend contract, reasoning tier included, on the thinking model under
    ``SWITCHED_TEMPLATE`` (``auto``: ``qwen3``): it thinks when asked, not otherwise."""

    def thinking_request(self) -> GenerationRequest:
        controls = ReasoningControls(thinking=True, budget_tokens=4)
        return replace(self.request(16), reasoning=controls)

    @pytest.fixture(scope="class")
    def observer(self) -> RecordingObserver:
        return RecordingObserver()

    def _config(self, folder: Path, **overrides: Any) -> Any:
        return config(source=str(folder), chat_template=SWITCHED_TEMPLATE, **overrides)

    @pytest.fixture(scope="class")
    async def backend(self, folder: Path, observer: RecordingObserver) -> AsyncIterator[HFBackend]:
        b = HFBackend(self._config(folder, max_num_seqs=8), observer)
        await b.start()
        yield b
        await b.stop()

    @pytest.fixture
    def unstarted(self, folder: Path) -> HFBackend:
        return HFBackend(self._config(folder))

    @pytest.fixture(scope="class")
    async def spare(self, folder: Path) -> AsyncIterator[HFBackend]:
        spare = HFBackend(self._config(folder, max_num_seqs=1, max_queue=2))
        await spare.start()
        yield spare
        await spare.stop()

    async def test_the_switch_turns_the_thought_on_and_off(self, backend: Backend) -> None:
        assert Feature.THINKING_SWITCH in backend.info().features
        off = await collect(backend.generate(ask(thinking=False)))
        assert off.text() and not off.thought() and off.usage.reasoning_tokens == 0
        on = await collect(backend.generate(ask(thinking=True, budget=4)))
        assert on.thought() and on.text() and on.usage.reasoning_tokens == 4
        markers_apart(on)
