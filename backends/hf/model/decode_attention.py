"""Decode attention kernels: one query per decoding slot over a strided view of the cache.

Three implementations of the same fp32 attention, timed per machine at load
(``SlotAttention._pick_decode_attention``) with a fourth where the C glue runs (bf16 on
CPU): its per-row kernel (``glue.Glue.decode_attention``, ``invariant``), which on AVX512
measured 0.2-0.6x SDPA's time per layer call on the AMX Xeon
(docs/benchmarks/glue/attention.md):

- ``sdpa``: PyTorch's fused kernel (CUDA; CPUs where its bf16 GEMMs are fast, e.g. AMX);
- ``matmul``: two fp32 batched matmuls over upcast copies of K and V;
- ``compiled``: the same maths as broadcast products and reductions, compiled by
  inductor (``compile_attention: true``). Decode attention is memory-bound (a handful of
  query rows per kv head); inductor fuses the bf16->fp32 upcast into one pass over K and
  V instead of writing and re-reading fp32 copies. Measured on an AMD EPYC (30 layers,
  2 threads): 16 rows x 1,040 keys 49 -> 30 ms, 64 rows x 120 keys 20 -> 15 ms; costs
  one compile (~20 s on 2 cores, cached on disk by inductor) at load.

Stateless functions; the compiled one is built per runner (``compiled_reduce``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


def decode_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """SDPA's fused kernel (accumulates in fp32) over ``[D, kv_heads, span, head_dim]``."""
    d, heads, hd = q.shape
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, attn_mask=bias, scale=scale, enable_gqa=True
    )
    return out.view(d, heads * hd)


def decode_matmul(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    *,
    softcap: float | None = None,
) -> torch.Tensor:
    """Two fp32 batched matmuls, the query heads sharing a kv head folded into the M
    dimension (no key repetition); half-precision operands are upcast (the strided cache
    view is copied either way) and the result cast back. With ``softcap`` (Gemma 2) the
    scaled scores become ``cap * tanh(score / cap)`` before the mask, as in transformers'
    eager attention."""
    d, heads, hd = q.shape
    kvh, span = k.shape[1], k.shape[2]
    qd = q.reshape(d * kvh, heads // kvh, hd).float()
    kd = k.reshape(d * kvh, span, hd).float()
    vd = v.reshape(d * kvh, span, hd).float()
    if softcap is None:
        scores = torch.baddbmm(bias, qd, kd.transpose(1, 2), alpha=scale)
    else:
        scores = torch.tanh(torch.bmm(qd, kd.transpose(1, 2)) * scale / softcap) * softcap + bias
    return torch.bmm(scores.softmax(-1), vd).view(d, heads * hd).to(q.dtype)


def prefill_softcapped(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    scale: float,
    softcap: float,
) -> torch.Tensor:
    """A prefill chunk's attention with soft-capped scores (SDPA has no cap):
    ``q [1, heads, T, hd]`` over ``k``/``v [1, kv_heads, L, hd]`` (the chunk's queries are
    the last ``T`` positions); ``mask`` boolean ``[T, L]``, None for plain causal. In fp32
    like the decode kernels; returns ``q``'s dtype."""
    t, length = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.tanh(q.float() @ keys.transpose(2, 3) * scale / softcap) * softcap
    if mask is None:
        mask = torch.ones(t, length, dtype=torch.bool, device=q.device).tril(length - t)
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ values).to(q.dtype)


def decode_reduce(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """``decode_matmul``'s attention written as products and sums (same bias layout),
    for inductor to fuse; eager, it would materialise the broadcasts."""
    d, heads, hd = q.shape
    kvh, span = k.shape[1], k.shape[2]
    qd = q.reshape(d, kvh, heads // kvh, 1, hd).float()
    scores = (qd * k.unsqueeze(2).float()).sum(-1) * scale + bias.view(d, kvh, 1, span)
    probs = scores.softmax(-1).unsqueeze(-1)
    return (probs * v.unsqueeze(2).float()).sum(-2).reshape(d, heads * hd).to(q.dtype)


def compiled_reduce() -> Attend:
    """``decode_reduce`` through ``torch.compile`` (dynamic rows and spans: one graph
    after the first two shapes; the runner warms both at load)."""
    compiled: Any = torch.compile(decode_reduce, dynamic=True)
    return compiled  # type: ignore[no-any-return]
