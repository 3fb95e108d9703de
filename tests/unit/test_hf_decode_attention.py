"""The two decode-attention paths of the runner compute the same attention."""

from __future__ import annotations

import pytest
import torch

from backends.hf.model.decode_attention import decode_matmul as _decode_matmul
from backends.hf.model.decode_attention import decode_sdpa as _decode_sdpa


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_and_upcast_matmuls_agree(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    rows, kv_heads, group, span, head_dim = 5, 3, 3, 40, 64
    k = torch.randn(rows, kv_heads, 64, head_dim).to(dtype)[:, :, :span]  # a strided view
    v = torch.randn(rows, kv_heads, 64, head_dim).to(dtype)[:, :, :span]
    q = torch.randn(rows, kv_heads * group, head_dim).to(dtype)
    lengths = torch.tensor([1, 7, 20, 33, 40])
    allowed = torch.arange(span)[None, :] < lengths[:, None]
    mask = torch.zeros(rows, span).masked_fill_(~allowed, float("-inf"))
    sdpa = _decode_sdpa(q, k, v, mask.to(dtype)[:, None, None, :], 0.125)
    flat = mask[:, None, None, :].expand(rows, kv_heads, 1, span).reshape(-1, 1, span)
    matmul = _decode_matmul(q, k, v, flat, 0.125)
    assert sdpa.dtype == matmul.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(matmul.float(), sdpa.float(), atol=tolerance, rtol=tolerance)
    # a row attends only to its own keys: row 0 sees key 0 alone, so it returns value 0
    expected = v[0, :, 0].float().repeat_interleave(group, dim=0).reshape(-1)
    torch.testing.assert_close(matmul[0].float(), expected, atol=tolerance, rtol=tolerance)
