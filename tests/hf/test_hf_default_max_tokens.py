"""A model's ``default_max_tokens`` on the hf backend: a request that sets no
``max_tokens`` stops there; one that sets it gets its own; without the default an
unlimited request may run to the context (OpenAI's meaning)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest

from backends.base import ContextLengthExceeded, GenerationRequest
from backends.hf.backend import HFBackend
from tests.hf.helpers import collect, completion, config


def unlimited(request: GenerationRequest) -> GenerationRequest:
    return dataclasses.replace(
        request, sampling=dataclasses.replace(request.sampling, max_tokens=None)
    )


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[HFBackend]:
    made = HFBackend(config(default_max_tokens=5, max_context=64, scheduling="sequential"))
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


async def test_no_max_tokens_stops_at_the_models_default(backend: HFBackend) -> None:
    request = unlimited(completion("Once upon a time", ignore_eos=True))
    result = await collect(backend.generate(request))
    assert result.usage.completion_tokens == 5
    assert result.reason() == "length"


async def test_the_clients_max_tokens_wins(backend: HFBackend) -> None:
    result = await collect(backend.generate(completion("Once upon a time", 3, ignore_eos=True)))
    assert result.usage.completion_tokens == 3
    result = await collect(backend.generate(completion("Once upon a time", 9, ignore_eos=True)))
    assert result.usage.completion_tokens == 9


async def test_the_default_is_capped_by_the_room_left(backend: HFBackend) -> None:
    """A prompt that leaves fewer than 5 of the 64 context tokens gets what is left."""
    text = "word" + " word" * 60
    result = await collect(backend.generate(unlimited(completion(text, ignore_eos=True))))
    room = 64 - result.usage.prompt_tokens
    assert 0 < room < 5  # the prompt is what this test needs
    assert result.usage.completion_tokens == room
    with pytest.raises(ContextLengthExceeded) as refused:
        await anext(backend.generate(completion(text, 5, ignore_eos=True)))
    assert refused.value.param == "max_tokens"
