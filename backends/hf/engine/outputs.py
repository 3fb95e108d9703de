"""Turn sampled tokens into events: EOS, stop strings, max_tokens, the thought apart
from the answer, text deltas, usage.

A reasoning model's chat choice reads each token's text through its thought
(``thought.ChoiceThought``): the thought becomes ``ReasoningDelta`` events, the answer
goes on through the stop strings (they end the answer, never the thought) and the
tool-call parser; the grammar reads the answer's tokens only.

Shared by every scheduling mode, so all modes stream and finish identically.
Owner: the engine thread; ``StepOutputs`` is drained once per step into one
cross-thread call.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from backends.base import (
    BackendError,
    BackendEvent,
    Finished,
    FinishReason,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from backends.hf.constrained.closing import ClosingGuard
from backends.hf.engine.sequence import Choice, RequestState
from backends.reasoning import Phase

log = logging.getLogger(__name__)

Item = BackendEvent | BackendError
StepOutputs = list[tuple[Any, Item]]


def emit_started(state: RequestState, out: StepOutputs) -> None:
    state.started = True
    out.append((state.sink, Started(queued_at=state.queued_at, started_at=time.time())))


def accept_token(
    choice: Choice, token: int, logprob: TokenLogprob | None, out: StepOutputs
) -> None:
    """Record ``token`` for ``choice``; append its events (the thought's text, then the
    answer's) and, if it ends the choice, its ``Finished`` (and the request's ``Usage``
    when it was the last open choice)."""
    state = choice.request
    params = choice.sampling
    choice.output_ids.append(token)
    choice.unsent += 1
    reason: FinishReason | None = None
    forced = choice.thought is not None and choice.thought.take_forced(token)
    matcher = _grammar_reads(choice, token)
    guard = choice.closing if matcher is not None else None
    closed = guard is not None and guard.forcing and guard.advance()
    ends = (
        not forced
        and token in state.eos_ids
        and (not params.ignore_eos or choice.matcher is not None)
    )
    if ends or (matcher is not None and matcher.is_terminated()):
        raw, final = choice.detok.flush(), True
        reason = "stop"
        if state.request.prompt_logprobs is None:
            # The end-of-sequence token is not part of the text. A scored request keeps
            # its entry, as vLLM's completions do: lm-evaluation-harness asks for one
            # token after the echoed prompt and drops the last entry as that token.
            logprob = None
    else:
        choice.counts[token] = choice.counts.get(token, 0) + 1
        raw = choice.detok.push(token)
        final = closed or len(choice.output_ids) >= state.max_tokens
        if final:
            raw += choice.detok.flush()
    thought, answer, thinking = _split(choice, raw, final)
    if thinking:
        logprob = None  # a thought's tokens are not the answer's: no logprobs for them
    text = choice.stop.feed(answer) + (choice.stop.flush() if final else "")
    if reason is None and choice.stop.stopped:
        reason = "stop"
    elif reason is None and final:
        # A value the grammar holds complete ended as it should, whether closed by
        # budget or complete exactly at max_tokens (its stop token did not fit).
        owed = guard is not None and guard.owes and matcher.is_completed()
        reason = "stop" if closed or owed else "length"
    pieces: list[str | ToolCallDelta] = [text] if text else []
    if choice.tools is not None:
        pieces = choice.tools.feed(text) if text else []
        if reason is not None:
            pieces += choice.tools.flush(cut=reason == "length")
        if reason == "stop" and choice.tools.calls:
            reason = "tool_calls"
    if thought or pieces or logprob is not None:
        _emit(choice, thought, pieces, logprob, out)
    if reason is not None:
        finish_choice(choice, reason, out)


def _grammar_reads(choice: Choice, token: int) -> Any:
    """The choice's matcher when it reads ``token`` (None when free, or while the choice
    thinks). Undecided (the model may still open a thought), the grammar reads the tokens
    it allows; ``_split`` starts it afresh if a thought opens after all."""
    matcher = choice.matcher
    thought = choice.thought
    if matcher is None or thought is None:
        if matcher is not None:
            matcher.accept_token(token)
        return matcher
    phase = thought.phase
    if phase is Phase.THINKING:
        return None
    took = bool(matcher.accept_token(token))
    if phase is Phase.UNDECIDED:
        thought.chose(token, grammar_took=took)
        return matcher if took else None
    return matcher


def _split(choice: Choice, raw: str, final: bool) -> tuple[str, str, bool]:
    """One token's text as (thought, answer, whether the token was thought); the grammar
    follows the choice across the thought's edges."""
    thought = choice.thought
    if thought is None:
        return "", raw, False
    before, counted = thought.phase, thought.tokens
    split = thought.read(raw, final=final)
    matcher = choice.matcher
    if matcher is not None and thought.phase is not before:
        if thought.phase is Phase.THINKING:  # the answer has not begun: start it afresh
            matcher.reset()
            if choice.closing is not None:
                choice.closing = ClosingGuard(choice.closing.closer)
        elif (
            before is Phase.THINKING
            and split.content.strip()
            and not matcher.accept_string(split.content.lstrip())
        ):
            # The token that closed the thought began the answer too, and the grammar
            # does not take that part (markers that are tokens of their own never do this).
            log.info("the answer's start %r is outside the grammar", split.content)
    return split.reasoning, split.content, thought.tokens > counted


def _emit(
    choice: Choice,
    thought: str,
    pieces: list[str | ToolCallDelta],
    logprob: TokenLogprob | None,
    out: StepOutputs,
) -> None:
    """The thought becomes a ``ReasoningDelta``, content pieces ``TextDelta`` values,
    calls pass as they are; the step's token count rides on the first event and its
    logprob on the first content delta (an empty one when there is none)."""
    sink = choice.request.sink
    if thought:
        out.append((sink, ReasoningDelta(choice.index, thought, choice.unsent)))
        choice.unsent = 0
    logprobs = (logprob,) if logprob is not None else ()
    if logprobs and not any(isinstance(piece, str) for piece in pieces):
        pieces = ["", *pieces]
    for piece in pieces:
        if isinstance(piece, str):
            out.append((sink, TextDelta(choice.index, piece, logprobs, choice.unsent)))
            logprobs = ()
        else:
            out.append((sink, replace(piece, num_tokens=choice.unsent)))
        choice.unsent = 0


def finish_choice(choice: Choice, reason: FinishReason, out: StepOutputs) -> None:
    state = choice.request
    choice.finish = reason
    closed = choice.closing is not None and choice.closing.closed
    choice.matcher = choice.closing = None  # release the grammar state as soon as it ends
    matched = choice.stop.matched if reason == "stop" else None
    finished = Finished(choice.index, reason, closed_by_budget=closed, stop_sequence=matched)
    out.append((state.sink, finished))
    if state.done:
        out.append(
            (
                state.sink,
                Usage(
                    prompt_tokens=len(state.prompt_ids),
                    completion_tokens=state.completion_tokens,
                    cached_tokens=state.cached,
                    reasoning_tokens=state.reasoning_tokens,
                ),
            )
        )
