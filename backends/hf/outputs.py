"""Turn sampled tokens into events: EOS, stop strings, max_tokens, text deltas, usage.

Shared by every scheduling mode, so all modes stream and finish identically.
Owner: the engine thread; ``StepOutputs`` is drained once per step into one
cross-thread call.
"""

from __future__ import annotations

import time
from typing import Any

from backends.base import (
    BackendError,
    BackendEvent,
    Finished,
    FinishReason,
    Started,
    TextDelta,
    TokenLogprob,
    Usage,
)
from backends.hf.sequence import Choice, RequestState

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
    if token in state.eos_ids and not params.ignore_eos:
        text = choice.stop.feed(choice.detok.flush()) + choice.stop.flush()
        reason = "stop"
        logprob = None  # the end-of-sequence token is not part of the text
    else:
        choice.counts[token] = choice.counts.get(token, 0) + 1
        text = choice.stop.feed(choice.detok.push(token))
        if choice.stop.stopped:
            reason = "stop"
        elif len(choice.output_ids) >= state.max_tokens:
            reason = "length"
            text += choice.stop.feed(choice.detok.flush()) + choice.stop.flush()
    if text or logprob is not None:
        logprobs = (logprob,) if logprob is not None else ()
        delta = TextDelta(
            index=choice.index, text=text, logprobs=logprobs, num_tokens=choice.unsent
        )
        choice.unsent = 0
        out.append((state.sink, delta))
    if reason is not None:
        finish_choice(choice, reason, out)


def finish_choice(choice: Choice, reason: FinishReason, out: StepOutputs) -> None:
    state = choice.request
    choice.finish = reason
    out.append((state.sink, Finished(index=choice.index, reason=reason)))
    if state.done:
        out.append(
            (
                state.sink,
                Usage(
                    prompt_tokens=len(state.prompt_ids), completion_tokens=state.completion_tokens
                ),
            )
        )
