"""A scored prompt (``PromptLogprobs``) in the two shapes clients read it in.

- OpenAI's legacy ``echo`` with ``logprobs`` (what lm-evaluation-harness reads): the
  prompt's tokens lead the choice's ``logprobs``, the first with a ``null`` log-probability
  and ``null`` alternatives, each other's alternatives holding the top ``logprobs`` tokens
  plus the prompt token itself (so up to ``logprobs + 1``, as OpenAI and vLLM return).
- vLLM's ``prompt_logprobs``: per choice, ``null`` for the first token, then per token a
  map from token id to ``{logprob, rank, decoded_token}`` holding the prompt token and
  the top alternatives.

Pure functions over immutable values.
"""

from __future__ import annotations

from typing import Any

from backends.base import GenerationRequest, PromptLogprobs, PromptToken, TokenLogprob, TopLogprob


def echo_text(request: GenerationRequest, scores: PromptLogprobs | None) -> str:
    """The prompt as echoed: the client's text, or a token-id prompt's tokens joined."""
    if not request.prompt_token_ids or scores is None:
        return request.prompt
    return "".join(token.token for token in scores.tokens)


def echo_logprobs(scores: PromptLogprobs) -> tuple[TokenLogprob, ...]:
    """The prompt's tokens as the leading entries of a choice's legacy ``logprobs``."""
    return tuple(_echoed(token) for token in scores.tokens)


def _echoed(token: PromptToken) -> TokenLogprob:
    if token.logprob is None:
        return TokenLogprob(token.token, None, token.bytes)
    top = token.top
    if all(alt.token_id != token.token_id for alt in top):
        top = (*top, TopLogprob(token.token, token.logprob, token.bytes, token.token_id))
    return TokenLogprob(token.token, token.logprob, token.bytes, top)


def vllm_prompt_logprobs(scores: PromptLogprobs) -> list[dict[str, Any] | None]:
    """vLLM's ``prompt_logprobs`` list for one prompt."""
    rendered: list[dict[str, Any] | None] = []
    for token in scores.tokens:
        if token.logprob is None:
            rendered.append(None)
            continue
        entry = {str(token.token_id): _vllm(token.logprob, token.rank, token.token)}
        for rank, alt in enumerate(token.top, start=1):
            if alt.token_id is not None:
                entry.setdefault(str(alt.token_id), _vllm(alt.logprob, rank, alt.token))
        rendered.append(entry)
    return rendered


def _vllm(logprob: float, rank: int | None, text: str) -> dict[str, Any]:
    return {"logprob": logprob, "rank": rank, "decoded_token": text}
