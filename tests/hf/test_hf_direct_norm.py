"""bf16 on CPU: the runner's direct RMSNorm gives exactly the logits of the fp32 upcast."""

from __future__ import annotations

import torch

from backends.hf.loading.loader import load
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from tests.hf.helpers import config


def test_direct_norm_logits_equal_upcast_ones() -> None:
    torch.set_num_threads(1)
    loaded = load(config(dtype="bfloat16"))
    results = []
    with torch.inference_mode():
        for direct in (True, False):
            runner = DecoderRunner(loaded.model, max_slots=2, max_context=256)
            assert runner._norm.direct  # CPU bf16: the probe finds the kernels agree
            runner._norm.direct = direct
            chunks = [
                PrefillChunk(slot=s, tokens=tuple(range(300, 333 + s)), start=0, want_logits=True)
                for s in range(2)
            ]
            prefill = runner.forward([], [], chunks)
            decode = runner.forward([7, 8], [33, 34], [])
            results.append((prefill, decode))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
