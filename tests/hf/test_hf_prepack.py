"""bf16 on CPU: oneDNN-prepacked linears give exactly the logits of plain ``F.linear``."""

from __future__ import annotations

import pytest
import torch

from backends.hf.loading.loader import load
from backends.hf.model import linears
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from tests.hf.helpers import config


@pytest.mark.skipif(
    not linears._can_prepack(torch.zeros(1, dtype=torch.bfloat16)),
    reason="no oneDNN linear prepacking in this torch build",
)
def test_prepacked_linears_match_plain_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(1)
    loaded = load(config(dtype="bfloat16"))
    with torch.inference_mode():
        packed = DecoderRunner(loaded.model, max_slots=4, max_context=512)
        monkeypatch.setattr(linears, "_can_prepack", lambda weight: False)
        plain = DecoderRunner(loaded.model, max_slots=4, max_context=512)
        assert isinstance(packed.layers[0].qkv, linears.Dense)
        assert packed.layers[0].qkv.prepacked and not plain.layers[0].qkv.prepacked
        # compare the linears, not the attention
        packed.attention.decode_impl = plain.attention.decode_impl
        packed.attention.decode_impl_long = plain.attention.decode_impl_long
        results = []
        for runner in (plain, packed):
            chunks = [
                PrefillChunk(
                    slot=s, tokens=tuple(range(200 + s, 240 + 7 * s)), start=0, want_logits=True
                )
                for s in range(3)
            ]
            prefill = runner.forward([], [], chunks)
            decode = runner.forward([11, 12, 13], [40, 46, 52], [])  # right after each prompt
            results.append((prefill, decode))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
