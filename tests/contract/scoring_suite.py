"""``ScoringContract``: the checks every backend that declares ``Feature.SCORE`` must pass,
whatever scores the pairs (cosines of an embedding model, a cross-encoder, a relay to an
upstream, any of them in a worker process), and the tokenizer checks of such a model when
it declares ``Feature.TOKENIZE``.

A test module subclasses it next to the backend it already builds and provides two
fixtures: ``scorer`` (a started backend the checks share) and ``unstarted`` (built, never
started). Class attributes: ``cosine`` (scores are cosines: a text scores 1 against
itself), ``chat_template`` (the tokenizer renders chats; else a chat is refused naming
``messages``). The checks are the contract of ``backends/scoring.py`` and
``backends/tokenizing.py``: one score per pair in ``text_2``'s order; a pair scores the
same alone, in a batch, one against many, pairwise, and asked as a rerank; usage counts
the prompt; ``detokenize`` inverts ``tokenize``; an unstarted backend refuses with
``NotReady`` before doing anything. (Generation backends are held to serve or refuse
scoring and tokenizing by their declaration in ``backend_suite``.)
"""

from __future__ import annotations

import math

import pytest

from backends.base import Backend, ChatMessage, Feature, InvalidRequest, NotReady
from backends.scoring import Scorer, ScoreRequest
from backends.tokenizing import DetokenizeRequest, TextTokenizer, TokenizeRequest

QUERY = "what is the capital of france"
DOCUMENTS = (
    "paris is the capital of france",
    "the quick brown fox jumps over the lazy dog",
    "berlin is the capital of germany",
)


def close(a: tuple[float, ...], b: tuple[float, ...], tolerance: float = 1e-4) -> bool:
    return len(a) == len(b) and all(
        math.isclose(x, y, abs_tol=tolerance) for x, y in zip(a, b, strict=True)
    )


class ScoringContract:
    """See the module docstring."""

    model = "contract-score"
    cosine = False
    chat_template = False
    tolerance = 1e-4

    def request(self, text_1: tuple[str, ...], text_2: tuple[str, ...], **kw: bool) -> ScoreRequest:
        return ScoreRequest("contract", self.model, text_1, text_2, **kw)

    async def test_declares_score_and_is_ready(self, scorer: Scorer) -> None:
        assert isinstance(scorer, Backend)
        assert Feature.SCORE in scorer.info().features
        assert await scorer.ready()

    async def test_one_against_many_in_order_and_alone(self, scorer: Scorer) -> None:
        together = await scorer.score(self.request((QUERY,), DOCUMENTS))
        assert len(together.scores) == len(DOCUMENTS)
        assert all(math.isfinite(score) for score in together.scores)
        assert len(set(together.scores)) == len(DOCUMENTS)  # three texts, three scores
        alone = [await scorer.score(self.request((QUERY,), (doc,))) for doc in DOCUMENTS]
        assert close(together.scores, tuple(r.scores[0] for r in alone), self.tolerance)
        assert together.prompt_tokens > alone[0].prompt_tokens > 0

    async def test_pairwise_and_rerank_score_the_same_pairs(self, scorer: Scorer) -> None:
        reference = await scorer.score(self.request((QUERY,), DOCUMENTS))
        pairwise = await scorer.score(self.request((QUERY,) * len(DOCUMENTS), DOCUMENTS))
        reranked = await scorer.score(self.request((QUERY,), DOCUMENTS, rerank=True))
        assert close(pairwise.scores, reference.scores, self.tolerance)
        assert close(reranked.scores, reference.scores, self.tolerance)
        swapped = await scorer.score(self.request(DOCUMENTS[::-1], DOCUMENTS[::-1]))
        assert len(swapped.scores) == len(DOCUMENTS)

    async def test_a_text_against_itself_is_one_for_cosines(self, scorer: Scorer) -> None:
        if not self.cosine:
            pytest.skip("not a cosine scorer")
        result = await scorer.score(self.request((DOCUMENTS[0],), DOCUMENTS))
        assert math.isclose(result.scores[0], 1.0, abs_tol=1e-5)
        assert max(result.scores) == result.scores[0]

    async def test_declared_tokenizer_round_trips(self, scorer: Scorer) -> None:
        if Feature.TOKENIZE not in scorer.info().features:
            pytest.skip("no tokenizer declared")
        assert isinstance(scorer, TextTokenizer)
        bare = await scorer.tokenize(
            TokenizeRequest("contract", self.model, prompt=QUERY, add_special_tokens=False)
        )
        special = await scorer.tokenize(TokenizeRequest("contract", self.model, prompt=QUERY))
        assert bare.tokens and bare.max_model_len > 0 and bare.token_strs is None
        assert len(special.tokens) >= len(bare.tokens)
        text = await scorer.detokenize(DetokenizeRequest("contract", self.model, bare.tokens))
        assert text.strip() == QUERY
        chat = TokenizeRequest(
            "contract", self.model, messages=(ChatMessage("user", QUERY),), return_token_strs=True
        )
        if not self.chat_template:
            with pytest.raises(InvalidRequest) as caught:
                await scorer.tokenize(chat)
            assert caught.value.param == "messages"
            return
        rendered = await scorer.tokenize(chat)
        assert rendered.token_strs is not None and len(rendered.token_strs) == len(rendered.tokens)

    async def test_unstarted_refuses_before_doing_anything(self, unstarted: Scorer) -> None:
        assert isinstance(unstarted, Backend)
        assert not await unstarted.ready()
        with pytest.raises(NotReady):
            await unstarted.score(self.request((QUERY,), DOCUMENTS))
