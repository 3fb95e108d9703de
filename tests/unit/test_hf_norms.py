"""``RMSNorm`` against transformers' own ``LlamaRMSNorm`` (the plain torch reference)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from backends.hf.model.norms import RMSNorm, direct_is_exact


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [1, 5, 64, 300])
def test_matches_llama_rms_norm_bitwise(dtype: torch.dtype, rows: int) -> None:
    hidden, eps = 576, 1e-5
    gen = torch.Generator().manual_seed(rows)
    reference = LlamaRMSNorm(hidden, eps=eps)
    with torch.no_grad():
        reference.weight.copy_(torch.randn(hidden, generator=gen))
    reference = reference.to(dtype)
    x = (torch.randn(rows, hidden, generator=gen) * 3).to(dtype)
    norm = RMSNorm(hidden, eps, dtype, torch.device("cpu"))
    with torch.inference_mode():
        got = norm(x, reference.weight.detach())
        want = reference(x)
    if dtype == torch.float32:  # one fused kernel, its own rounding of the last op
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want)


def test_cpu_bfloat16_takes_the_direct_kernel() -> None:
    """The saving is real on the machines we serve from: no fp32 round trip on CPU."""
    assert direct_is_exact(576, 1e-5, torch.bfloat16, torch.device("cpu"))
    assert RMSNorm(576, 1e-5, torch.bfloat16, torch.device("cpu")).direct
    assert not RMSNorm(576, 1e-5, torch.float32, torch.device("cpu")).direct
