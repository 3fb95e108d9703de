"""Prompt log-probabilities computed in the prefill equal transformers' own forward.

A tiny fp32 random-weight Llama (the packed runner) and GPT-NeoX (the module runner):
every prompt token's log-probability within 1e-3 nats of ``log_softmax`` of the model's
own logits, also when the prefill is cut into chunks, when other requests share the
step, and when the prefix cache already holds the prompt (warm == cold). ``max_tokens``
0 scores the prompt and generates nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from backends.base import PromptLogprobs, TextDelta
from backends.hf.backend import HFBackend
from tests.hf import tiny
from tests.hf.helpers import RecordingObserver, collect, completion, config

PROMPTS = [
    "The capital of France is Paris, and the capital of Italy is Rome. Once upon a time",
    "def fibonacci(n): return n if n < 2 else",
    "Water boils at one hundred degrees; ice melts at zero. Hello",
]
TOP = 3


def transformers_scores(folder: Path, prompts: list[str]) -> list[tuple[list[int], list[float]]]:
    """Per prompt, its ids and log P(token i | tokens before it) for i >= 1, by
    transformers' own forward."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    found = []
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            logprobs = model(ids).logits[0].float().log_softmax(-1)
        values = logprobs[:-1].gather(1, ids[0, 1:, None])[:, 0]
        found.append((ids[0].tolist(), values.tolist()))
    return found


def scored(prompt: str, max_tokens: int = 0, top: int = TOP) -> object:
    return replace(completion(prompt, max_tokens), prompt_logprobs=top)


def check(scores: PromptLogprobs, ids: list[int], expected: list[float], tol: float) -> None:
    tokens = scores.tokens
    assert [t.token_id for t in tokens] == ids
    assert tokens[0].logprob is None and tokens[0].rank is None and tokens[0].top == ()
    got = [t.logprob for t in tokens[1:]]
    assert max(abs(g - e) for g, e in zip(got, expected, strict=True)) <= tol  # type: ignore[operator]
    for token in tokens[1:]:
        values = [alt.logprob for alt in token.top]
        assert len(values) == TOP and values == sorted(values, reverse=True)
        assert (token.rank == 1) == (token.top[0].token_id == token.token_id)
        assert token.rank is not None and (
            token.rank > TOP or token.top[token.rank - 1].token_id == token.token_id
        )


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
async def test_prompt_logprobs_equal_transformers(family: str, tmp_path: Path) -> None:
    folder = tiny.build(family, tmp_path / family)
    reference = transformers_scores(folder, PROMPTS)
    observer = RecordingObserver()
    # A 16-token step budget: every prompt is prefilled in several chunks.
    backend = HFBackend(
        config(source=str(folder), max_num_seqs=4, max_num_batched_tokens=16), observer
    )
    await backend.start()
    try:
        alone = [await collect(backend.generate(scored(p))) for p in PROMPTS]  # type: ignore[arg-type]
        for result, (ids, expected) in zip(alone, reference, strict=True):
            check(result.prompt, ids, expected, 1e-3)
            assert not [e for e in result.events if isinstance(e, TextDelta)]
            assert result.reason() == "length"
            assert result.usage.completion_tokens == 0
            assert result.usage.prompt_tokens == len(ids)
        # Warm: the prompts' blocks are cached now (the scored prefills stored them, and a
        # plain request reads them), yet a scored request computes every position again.
        plain = await collect(backend.generate(completion(PROMPTS[0], 4)))
        assert observer.prefix[-1][1] >= 16
        hits_before = [hit for _, hit in observer.prefix]
        # Batched: the three scored prompts beside a generating request, at once.
        together = await asyncio.gather(
            collect(backend.generate(completion(PROMPTS[0], 6))),
            *(collect(backend.generate(scored(p, 2))) for p in PROMPTS),  # type: ignore[arg-type]
        )
        assert together[0].text().startswith(plain.text())
        for result, single in zip(together[1:], alone, strict=True):
            assert result.usage.completion_tokens == 2
            for a, b in zip(result.prompt.tokens, single.prompt.tokens, strict=True):
                assert a.token_id == b.token_id and a.rank == b.rank
                assert a.logprob == pytest.approx(b.logprob, abs=1e-5)
        hits = [hit for _, hit in observer.prefix][len(hits_before) :]
        assert len(hits) == 4 and sorted(hits)[:3] == [0, 0, 0] and max(hits) >= 16
        assert max(size for size, _, _ in observer.steps) > 1  # they really shared steps
    finally:
        await backend.stop()
