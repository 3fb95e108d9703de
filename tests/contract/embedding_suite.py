"""``EmbeddingContract``: the checks every embedding backend must pass, whatever serves
the model (the hf pooling engine, the same in a worker process, a relay to an upstream).

A test module subclasses it next to the backend it already builds and provides two
fixtures: ``embedder`` (a started backend the checks share) and ``unstarted`` (built,
never started). Class attributes say what the model can do: ``token_ids`` (token-id
inputs) and ``dimensions`` (vectors cut to a length). The checks are the contract of
``backends/embeddings.py``: the backend declares ``Feature.EMBEDDINGS``; one vector per
input, in input order, all of one length; the same input gives the same vector, in one
call and across calls; usage counts the prompt; an unstarted backend refuses with
``NotReady`` before doing anything.
"""

from __future__ import annotations

import math

import pytest

from backends.base import Backend, Feature, NotReady
from backends.embeddings import Embedder, EmbeddingRequest

TEXTS = ("The capital of France is Paris.", "Embeddings map text to vectors.")


def close(a: tuple[float, ...], b: tuple[float, ...], tolerance: float = 1e-4) -> bool:
    if len(a) != len(b):
        return False
    return all(math.isclose(x, y, abs_tol=tolerance) for x, y in zip(a, b, strict=True))


class EmbeddingContract:
    """See the module docstring."""

    model = "contract-embed"
    token_ids = True
    dimensions = True

    def request(self, *texts: str, dimensions: int | None = None) -> EmbeddingRequest:
        return EmbeddingRequest(
            request_id="contract", model=self.model, texts=texts, dimensions=dimensions
        )

    async def test_declares_embeddings_and_is_ready(self, embedder: Embedder) -> None:
        assert isinstance(embedder, Backend)
        assert Feature.EMBEDDINGS in embedder.info().features
        assert await embedder.ready()

    async def test_one_vector_per_input_in_order(self, embedder: Embedder) -> None:
        first, second = TEXTS
        result = await embedder.embed(self.request(first, second, first))
        assert len(result.vectors) == 3
        assert len({len(vector) for vector in result.vectors}) == 1
        assert len(result.vectors[0]) > 1
        assert close(result.vectors[0], result.vectors[2])
        assert not close(result.vectors[0], result.vectors[1])
        assert result.prompt_tokens > 0

    async def test_the_same_input_embeds_the_same_across_calls(self, embedder: Embedder) -> None:
        alone = await embedder.embed(self.request(TEXTS[1]))
        together = await embedder.embed(self.request(*TEXTS))
        assert close(alone.vectors[0], together.vectors[1], tolerance=1e-3)
        assert together.prompt_tokens > alone.prompt_tokens > 0

    async def test_token_ids_inputs(self, embedder: Embedder) -> None:
        if not self.token_ids:
            pytest.skip("this model takes text only")
        ids = ((101, 2023, 2003, 102), (101, 7592, 102))
        request = EmbeddingRequest(request_id="contract", model=self.model, token_ids=ids)
        result = await embedder.embed(request)
        assert len(result.vectors) == 2
        assert len(result.vectors[0]) == len(result.vectors[1]) > 1
        assert result.prompt_tokens >= 7

    async def test_dimensions_cut_the_vectors(self, embedder: Embedder) -> None:
        if not self.dimensions:
            pytest.skip("this model keeps its own size")
        full = await embedder.embed(self.request(TEXTS[0]))
        cut = await embedder.embed(self.request(TEXTS[0], dimensions=8))
        assert len(cut.vectors[0]) == 8 < len(full.vectors[0])

    async def test_unstarted_refuses_before_doing_anything(self, unstarted: Embedder) -> None:
        assert isinstance(unstarted, Backend)
        assert not await unstarted.ready()
        with pytest.raises(NotReady):
            await unstarted.embed(self.request(TEXTS[0]))
