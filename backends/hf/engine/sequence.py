"""Engine-side state of one request and of each of its choices.

Owner: the engine thread creates, mutates and drops these; the event loop never sees
them (it only receives immutable ``BackendEvent`` values). ``RequestState.sink`` is an
opaque delivery target that the engine passes back to the backend's dispatcher.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from backends.base import FinishReason, GenerationRequest, PromptToken, SamplingParams
from backends.hf.constrained.closing import ClosingGuard
from backends.hf.constrained.grammar import Constraint, new_matcher
from backends.hf.engine.detokenizer import IncrementalDetokenizer, StopMatcher, TokenDecoder
from backends.hf.engine.thought import ChoiceThought, ThoughtMarkup
from backends.tool_markup.markup import tools_active
from backends.tool_markup.parser import ToolCallParser


@dataclass(eq=False)
class Choice:
    """One output stream (choice ``index``) of a request; holds cache slot ``slot``."""

    request: RequestState
    index: int
    detok: IncrementalDetokenizer
    stop: StopMatcher
    generator: torch.Generator | None
    slot: int = -1
    length: int = 0  # tokens of this choice already in the KV cache
    output_ids: list[int] = field(default_factory=list)
    counts: dict[int, int] = field(default_factory=dict)
    finish: FinishReason | None = None
    unsent: int = 0  # tokens whose text is still held back (UTF-8 or stop prefix)
    # Constrained decoding: this choice's own xgrammar matcher (None when free), what
    # keeps its value able to close within max_tokens (``constrained.closing``; None when free or
    # off), and the parser that turns tool-call markup into ToolCallDelta events. The
    # matcher reads the answer only: it starts where the choice's thought ends.
    matcher: Any = None
    closing: ClosingGuard | None = None
    tools: ToolCallParser | None = None
    # A reasoning model's chat choice: its thought apart from its answer (``thought``).
    thought: ChoiceThought | None = None

    @property
    def sampling(self) -> SamplingParams:
        return self.request.request.sampling

    @property
    def next_input(self) -> int:
        return self.output_ids[-1]


@dataclass(eq=False)
class RequestState:
    """A request inside the engine: prompt ids, progress of its (shared) prefill, choices."""

    request: GenerationRequest
    sink: Any
    prompt_ids: list[int]
    max_tokens: int
    queued_at: float
    eos_ids: frozenset[int]
    choices: list[Choice] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens already in the cache (in choice 0's slot)
    cached: int = 0  # of those, the ones restored from the prefix cache (Usage.cached_tokens)
    started: bool = False
    aborted: bool = False
    grammar: Constraint | None = None  # the compiled grammar, or None for free text
    # Whether the output starts inside a thought, as the rendered prompt says; None when
    # nothing is split (no reasoning parser, or not a chat request).
    in_thought: bool | None = None
    adapter: int = -1  # its LoRA adapter's slot in the runner's bank; -1: the base model
    adapter_key: int = -1  # that slot's load (unique; the prefix cache keys on it)
    # The prompt's tokens scored so far, when the request asked (sent once it is whole).
    prompt_scores: list[PromptToken] = field(default_factory=list)

    @property
    def n(self) -> int:
        return self.request.sampling.n

    @property
    def done(self) -> bool:
        return bool(self.choices) and all(c.finish is not None for c in self.choices)

    @property
    def completion_tokens(self) -> int:
        return sum(len(c.output_ids) for c in self.choices)

    @property
    def reasoning_tokens(self) -> int:
        return sum(c.thought.tokens for c in self.choices if c.thought is not None)


def make_choices(
    state: RequestState,
    tokenizer: TokenDecoder,
    device: torch.device,
    markup: ThoughtMarkup | None = None,
) -> None:
    """Create the request's ``n`` choices, each with its own detokenizer, stop matcher,
    grammar matcher (when constrained: all start from the same state, so this is the
    fork), thought (a reasoning model's chat request: ``markup`` and ``in_thought``) and
    (for sampled requests) its own generator, so a seeded request draws the same numbers
    whatever else shares the batch."""
    params = state.request.sampling
    parse_tools = tools_active(state.request)
    grammar = state.grammar
    closer = grammar.closer if grammar is not None else None
    hidden = markup.hidden if markup is not None and state.in_thought is not None else None
    base_seed = params.seed if params.seed is not None else random.getrandbits(63)
    for index in range(params.n):
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=device)
            generator.manual_seed((base_seed + index) % (2**63))
        state.choices.append(
            Choice(
                request=state,
                index=index,
                detok=IncrementalDetokenizer(tokenizer, state.prompt_ids, hidden),
                stop=StopMatcher(params.stop),
                generator=generator,
                matcher=new_matcher(grammar) if grammar is not None else None,
                closing=ClosingGuard(closer) if closer is not None else None,
                tools=ToolCallParser(index) if parse_tools else None,
                thought=_thought(state, markup),
            )
        )


def _thought(state: RequestState, markup: ThoughtMarkup | None) -> ChoiceThought | None:
    if markup is None or state.in_thought is None:
        return None
    budget = state.request.reasoning.budget_tokens
    return ChoiceThought.start(markup, in_thought=state.in_thought, budget=budget)
