"""Turn sampled tokens into events: EOS, stop strings, max_tokens, text deltas, usage.

Shared by every scheduling mode, so all modes stream and finish identically.
Owner: the engine thread; ``StepOutputs`` is drained once per step into one
cross-thread call.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from backends.base import (
    BackendError,
    BackendEvent,
    Finished,
    FinishReason,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
)
from backends.hf.engine.sequence import Choice, RequestState

Item = BackendEvent | BackendError
StepOutputs = list[tuple[Any, Item]]


def emit_started(state: RequestState, out: StepOutputs) -> None:
    state.started = True
    out.append((state.sink, Started(queued_at=state.queued_at, started_at=time.time())))


def accept_token(
    choice: Choice, token: int, logprob: TokenLogprob | None, out: StepOutputs
) -> None:
    """Record ``token`` for ``choice``; append its text delta and, if it ends the choice,
    its ``Finished`` (and the request's ``Usage`` when it was the last open choice)."""
    state = choice.request
    params = choice.sampling
    choice.output_ids.append(token)
    choice.unsent += 1
    reason: FinishReason | None = None
    matcher = choice.matcher
    if matcher is not None:
        matcher.accept_token(token)
    guard = choice.closing
    closed = guard is not None and guard.forcing and guard.advance()
    ends = token in state.eos_ids and (not params.ignore_eos or matcher is not None)
    if ends or (matcher is not None and matcher.is_terminated()):
        text = choice.stop.feed(choice.detok.flush()) + choice.stop.flush()
        reason = "stop"
        if state.request.prompt_logprobs is None:
            # The end-of-sequence token is not part of the text. A scored request keeps
            # its entry, as vLLM's completions do: lm-evaluation-harness asks for one
            # token after the echoed prompt and drops the last entry as that token.
            logprob = None
    else:
        choice.counts[token] = choice.counts.get(token, 0) + 1
        text = choice.stop.feed(choice.detok.push(token))
        if choice.stop.stopped:
            reason = "stop"
        elif closed or len(choice.output_ids) >= state.max_tokens:
            # A value the grammar holds complete ended as it should, whether closed by
            # budget or complete exactly at max_tokens (its stop token did not fit).
            owed = guard is not None and guard.owes and matcher.is_completed()
            reason = "stop" if closed or owed else "length"
            text += choice.stop.feed(choice.detok.flush()) + choice.stop.flush()
    if choice.tools is None:
        if text or logprob is not None:
            _emit(choice, [text], logprob, out)
    else:
        pieces = choice.tools.feed(text) if text else []
        if reason is not None:
            pieces += choice.tools.flush(cut=reason == "length")
        if pieces or logprob is not None:
            _emit(choice, pieces, logprob, out)
        if reason == "stop" and choice.tools.calls:
            reason = "tool_calls"
    if reason is not None:
        finish_choice(choice, reason, out)


def _emit(
    choice: Choice,
    pieces: list[str | ToolCallDelta],
    logprob: TokenLogprob | None,
    out: StepOutputs,
) -> None:
    """Content pieces become ``TextDelta`` values, calls pass as they are; the step's
    token count and logprob ride on the first event (a content delta when there is one)."""
    sink = choice.request.sink
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
                ),
            )
        )
