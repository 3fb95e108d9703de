"""The packed runner's projections: dense, or weight-only quantized (int8, int4).

A decode step at small batch reads every weight once and computes little, so its time is
the bytes it reads. Weight-only quantization cuts those bytes (bf16 -> int8 halves them,
int4 quarters them) while activations stay in the model's dtype. The kernels are
PyTorch's own CPU weight-only ones (``_weight_int8pack_mm``: int8 per output channel;
``_weight_int4pack_mm_for_cpu``: int4 in groups along the input, a scale and a zero per
group), the ones torchao calls; none is written here.

Quantization is round-to-nearest from the loaded weights: int8 symmetric per output
channel (scale = max|w| / 127); int4 asymmetric per group (``w ~= (q - 8) * scale + zero``
with q in 0..15 spanning the group's min..max, the kernel's convention). Every linear
runs the same kernel whatever the batch, so a sequence's output does not depend on what
else is in its step.

Owner: built once at load by the runner, read-only afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from backends.hf.loading.quantization import Scheme
from backends.hf.model.row_blocks import invariant_width

_PACK_BATCH_HINT = 16  # oneDNN picks its blocking for about this many rows


class QuantizationError(ValueError):
    """A weight cannot take the asked quantization (shape, device)."""


class Linear(Protocol):
    """``y = x @ W.T + b`` for one projection, in the activations' dtype."""

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads per call: the weight (and scales), not the activations."""
        ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True, slots=True)
class Dense:
    """The weight as loaded; on CPU in bf16, reordered once into oneDNN's blocked layout
    (what vLLM-CPU and inductor's freezing do), so no GEMM reorders it per call. Measured
    on an AMD EPYC: identical outputs, 0.5x (1 row) to 0.96x (300 rows) of ``F.linear``'s
    time. A bf16 CPU projection takes at most ``row_block`` rows per GEMM (``None``: any),
    the most with which every row rounds as it would alone (``row_blocks``: 32 on AMX
    CPUs, any elsewhere)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    prepacked: bool
    nbytes: int
    row_block: int | None = None

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Dense:
        weight = weight.contiguous()
        size = weight.numel() * weight.element_size()
        prepacked = _can_prepack(weight)
        stored = _pack(weight) if prepacked else weight
        block = None
        if weight.device.type == "cpu" and weight.dtype == torch.bfloat16:
            block = _row_block(weight, stored, prepacked)
        return cls(stored, bias, prepacked, size, block)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.row_block is None or rows.shape[0] <= self.row_block:
            return _dense(x, self.weight, self.bias, self.prepacked)
        block = self.row_block
        parts = [
            _dense(rows[start : start + block], self.weight, self.bias, self.prepacked)
            for start in range(0, rows.shape[0], block)
        ]
        return torch.cat(parts).reshape(*x.shape[:-1], -1)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_BATCH_HINT)
    return packed


def _dense(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, prepacked: bool
) -> torch.Tensor:
    if prepacked:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return out
    return F.linear(x, weight, bias)


_ROW_BLOCKS: dict[tuple[int, int, bool], int | None] = {}
"""Memo of :func:`_row_block` per weight shape: a pure function of the CPU and the shape
(the kernel oneDNN picks depends on the shape, not the values), so a race only computes
it twice; a model has a handful of shapes, and the memo stops growing at 256."""

_PROBE_OUT_FEATURES = 8192
"""A wider weight is probed on its first 8,192 rows: how a GEMM groups and sums an input
row does not depend on how many outputs it has (checked on SmolLM2's 49,152-row LM head,
``tests/hf/test_hf_row_blocks.py``), and a 150k-row head probed whole takes seconds."""


def _row_block(weight: torch.Tensor, stored: torch.Tensor, prepacked: bool) -> int | None:
    """``invariant_width`` of this bf16 CPU projection (``stored``: ``weight`` as the
    projection keeps it), probed once per shape (~0.1 s)."""
    key = (int(weight.shape[0]), int(weight.shape[1]), prepacked)
    if key in _ROW_BLOCKS:
        return _ROW_BLOCKS[key]
    packed = stored
    if key[0] > _PROBE_OUT_FEATURES:  # only a wide one is probed on a packed slice
        probe = weight[:_PROBE_OUT_FEATURES].contiguous()
        packed = _pack(probe) if prepacked else probe
    width = invariant_width(lambda x: _dense(x, packed, None, prepacked), key[1])
    if len(_ROW_BLOCKS) < 256:
        _ROW_BLOCKS[key] = width
    return width


@dataclass(frozen=True, slots=True)
class Int8:
    """int8 weight [out, in], one scale per output channel (the activations' dtype)."""

    weight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None
    nbytes: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> Int8:
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        scales = scales.to(weight.dtype)
        return cls(q, scales, bias, q.numel() + scales.numel() * scales.element_size())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, x.shape[-1]), self.weight, self.scales
        )
        out = out.reshape(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias


@dataclass(frozen=True, slots=True)
class Int4:
    """int4 weight packed for the CPU kernel; per group of ``group`` inputs a scale and a
    zero, stored ``[in / group, out, 2]`` in the activations' dtype."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    group: int
    out_features: int
    bias: torch.Tensor | None
    nbytes: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None, group: int) -> Int4:
        out_features, in_features = weight.shape
        if in_features % group:
            raise QuantizationError(
                f"int4 needs the input width ({in_features}) to be a multiple of the group "
                f"size ({group})"
            )
        grouped = weight.detach().float().reshape(out_features, in_features // group, group)
        low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
        scale = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round((grouped - low[..., None]) / scale[..., None]).clamp(0, 15)
        q = q.to(torch.int32).reshape(out_features, in_features)
        zero = low + 8 * scale  # the kernel computes (q - 8) * scale + zero
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        pairs = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(weight.dtype)
        size = packed.numel() * packed.element_size() + pairs.numel() * pairs.element_size()
        return cls(packed, pairs, group, out_features, bias, size)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, x.shape[-1]), self.packed, self.group, self.scales_and_zeros
        )
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


def make_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, scheme: Scheme, group: int = 32
) -> Linear:
    """The projection ``weight`` (``[out, in]``) as ``scheme`` asks."""
    if scheme == "none":
        return Dense.of(weight, bias)
    if weight.device.type != "cpu":
        raise QuantizationError(
            f"{scheme} weights run on CPU only (the model is on {weight.device})"
        )
    if scheme == "int8":
        return Int8.of(weight, bias)
    return Int4.of(weight, bias, group)


def _can_prepack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )
