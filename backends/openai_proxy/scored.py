"""Relay a completion whose prompt is scored (``GenerationRequest.prompt_logprobs``).

vLLM returns a prompt's log-probabilities only in a whole answer (its ``prompt_logprobs``
refuses ``stream: true``), so such a request goes up once, not streamed, with
``prompt_logprobs: N`` and ``return_token_ids`` (the prompt's ids come back beside the
scores, so each entry is known by id, not guessed from text). ``max_tokens`` 0 is sent as
vLLM's ``echo`` with ``max_tokens: 0``, its one way to generate nothing; with
``return_token_ids`` the echoed text is empty and the choice's ``logprobs`` (then the
prompt's) are not read. The answer becomes the events a stream would have given:
``PromptLogprobs``, then per choice one ``TextDelta`` and its ``Finished``. Pure
functions; the backend does the I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import (
    BackendEvent,
    Finished,
    GenerationRequest,
    PromptLogprobs,
    PromptToken,
    TextDelta,
    TopLogprob,
    UpstreamBadResponse,
)
from backends.openai_proxy.stream import REASONS, completion_logprobs


def scored_body(body: dict[str, Any], request: GenerationRequest) -> bytes:
    """The streaming ``body`` turned into vLLM's whole-answer scoring request."""
    plain = {key: value for key, value in body.items() if key != "stream_options"}
    plain.update(stream=False, prompt_logprobs=request.prompt_logprobs, return_token_ids=True)
    if request.sampling.max_tokens == 0:
        plain["echo"] = True
    return orjson.dumps(plain)


def scored_events(
    payload: Any, request: GenerationRequest
) -> tuple[list[BackendEvent], tuple[int, int]]:
    """The answer's events and its ``(prompt_tokens, completion_tokens)``."""
    try:
        choices = sorted(payload["choices"], key=lambda choice: int(choice["index"]))
        first = choices[0]
        top = request.prompt_logprobs or 0
        prompt = _prompt(first["prompt_token_ids"], first["prompt_logprobs"], top)
        usage = payload["usage"]
        counts = (int(usage["prompt_tokens"]), int(usage["completion_tokens"]))
    except (KeyError, IndexError, TypeError, ValueError):
        raise UpstreamBadResponse("upstream answer has no usable prompt_logprobs") from None
    events: list[BackendEvent] = [prompt]
    generated = request.sampling.max_tokens != 0
    for choice in choices:
        index = int(choice["index"])
        raw = choice.get("logprobs") if request.sampling.logprobs is not None else None
        logprobs = completion_logprobs(raw) if generated and isinstance(raw, dict) else ()
        text = str(choice.get("text") or "") if generated else ""
        if text or logprobs:
            events.append(TextDelta(index, text, logprobs, len(logprobs) or 1))
        reason = REASONS.get(str(choice.get("finish_reason")), "stop")
        events.append(Finished(index, reason if generated else "length"))
    return events, (counts[0], counts[1] if generated else 0)


def _prompt(ids: list[int], scores: list[Any], top: int) -> PromptLogprobs:
    if len(ids) != len(scores) or not ids:
        raise ValueError("prompt ids and scores differ in length")
    # vLLM scores no first token, nor decodes it: its text stays "" here.
    tokens = [PromptToken(int(ids[0]), "", (), None, None)]
    rest = zip(ids[1:], scores[1:], strict=True)
    tokens.extend(_token(int(token), entry, top) for token, entry in rest)
    return PromptLogprobs(tuple(tokens))


def _token(token_id: int, entry: dict[str, Any], top: int) -> PromptToken:
    """``entry``: vLLM's map of token id to ``{logprob, rank, decoded_token}``, holding the
    prompt token and the ``top`` best (the prompt token once when it is among them)."""
    own = entry[str(token_id)]
    best = sorted(
        (int(value["rank"]), int(key), value)
        for key, value in entry.items()
        if int(value["rank"]) <= top
    )
    text = str(own.get("decoded_token") or "")
    return PromptToken(
        token_id,
        text,
        tuple(text.encode()),
        float(own["logprob"]),
        int(own["rank"]),
        tuple(_alternative(key, value) for _, key, value in best),
    )


def _alternative(token_id: int, value: dict[str, Any]) -> TopLogprob:
    text = str(value.get("decoded_token") or "")
    return TopLogprob(text, float(value["logprob"]), tuple(text.encode()), token_id)
