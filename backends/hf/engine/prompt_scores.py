"""Prompt log-probabilities from the logits a prefill already computes (no second pass).

A scoring chunk's step returns the logits of every one of its positions: the row of
position ``q`` is the model's distribution of the token at ``q + 1``, so it scores the
next prompt token (or, at the prompt's last position, is the row the first output token
is sampled from). The first prompt token has nothing before it: no log-probability.
Values are the model's own log-softmax in fp32 (no temperature, penalty or grammar:
the prompt is not sampled); ``rank`` is 1 + how many tokens are strictly more likely.

Owner: the engine thread (through the scheduler).
"""

from __future__ import annotations

import torch

from backends.base import PromptToken, TopLogprob
from backends.hf.engine.detokenizer import TokenTable


def first_token(token_id: int, table: TokenTable) -> PromptToken:
    text, raw = table.get(token_id)
    return PromptToken(token_id, text, raw, None, None)


def score_rows(
    logits: torch.Tensor, targets: list[int], top: int, table: TokenTable
) -> list[PromptToken]:
    """One entry per row of ``logits`` ([rows, vocab]): ``targets[i]`` scored by row ``i``,
    with the ``top`` most likely tokens of that row."""
    logprobs = logits.float().log_softmax(-1)
    ids = torch.tensor(targets, dtype=torch.long, device=logits.device)
    chosen = logprobs.gather(1, ids[:, None])
    ranks = ((logprobs > chosen).sum(-1) + 1).tolist()
    values = chosen[:, 0].tolist()
    tops: list[tuple[TopLogprob, ...]] = [()] * len(targets)
    if top > 0:
        best, best_ids = torch.topk(logprobs, top, dim=-1)
        tops = [
            tuple(_alternative(i, v, table) for i, v in zip(row_ids, row_values, strict=True))
            for row_ids, row_values in zip(best_ids.tolist(), best.tolist(), strict=True)
        ]
    return [
        PromptToken(token, *table.get(token), value, rank, alternatives)
        for token, value, rank, alternatives in zip(targets, values, ranks, tops, strict=True)
    ]


def _alternative(token_id: int, logprob: float, table: TokenTable) -> TopLogprob:
    text, raw = table.get(token_id)
    return TopLogprob(text, logprob, raw, token_id)
