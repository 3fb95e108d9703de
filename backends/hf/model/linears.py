"""The packed runner's projections: dense, weight-only quantized (int8, int4), or integer
dot products (``w4a8``).

A decode step at small batch reads every weight once and computes little, so its time is
the bytes it reads. Weight-only quantization cuts those bytes (bf16 -> int8 halves them,
int4 quarters them) while activations stay in the model's dtype. The kernels are
PyTorch's own CPU weight-only ones (``_weight_int8pack_mm``: int8 per output channel;
``_weight_int4pack_mm_for_cpu``: int4 in groups along the input, a scale and a zero per
group), the ones torchao calls (a long prompt's rows: on the weights unpacked to bf16,
``csrc/unpack.c``); int4 on a CPU with AMX runs ours instead (``Int4Tiles``,
``csrc/int4_amx.c``), whose time grows far less with the rows. ``w4a8`` (a setting of its own,
since it changes the numbers) runs in our C kernel (``csrc/int_dot.c``, ``IntDot``): 4-
or 8-bit weights on GGUF's grids times activations rounded per call to 8- or 16-bit
integers (a long prompt's rows: on the weights unpacked to bf16, ``Unpacked``).

Quantization is round-to-nearest from the loaded weights: int8 symmetric per output
channel (scale = max|w| / 127); int4 asymmetric per group (``w ~= (q - 8) * scale + zero``
with q in 0..15 spanning the group's min..max, the kernel's convention). A row takes the
same kernel whatever else is in its step (a decode row or short prompt's one, a long
prompt's rows theirs), so a sequence's output does not depend on its batch.

Owner: built once at load by the runner, read-only afterwards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from backends.hf.loading.quantization import Scheme
from backends.hf.model.glue import Glue, IntDotCall
from backends.hf.model.glue import load as load_glue
from backends.hf.model.row_blocks import fixed_widths, invariant_width

_PACK_BATCH_HINT = 16  # oneDNN picks its blocking for about this many rows

UNPACKED_PROMPT_TOKENS = 64
"""Prompts from this long on run an integer-dot projection on its weight unpacked to bf16
(``IntDot``). Unpacking costs the same whatever the rows, so it pays only for enough of
them: on SmolLM2's four layer shapes (AMX Xeon, two threads, two runs) the integer
kernel took 0.84-0.86 ms for 64 rows against 1.10-1.11 unpacked (the unpacking alone:
0.26 ms), 1.65-1.88 against 1.32-1.44 for 128, 7.0-8.0 against 2.75-3.18 for 512. A step
unpacks once for all its prompts' rows, so two 64-token prompts in one step already gain;
a shorter prompt would make a chat's first token later (one user chatting sends short
ones)."""


class QuantizationError(ValueError):
    """A weight cannot take the asked quantization (shape, device)."""


class Linear(Protocol):
    """``y = x @ W.T + b`` for one projection, in the activations' dtype."""

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads per call: the weight (and scales), not the activations."""
        ...

    @property
    def prompt_tokens(self) -> int | None:
        """The shortest prompt whose rows this projection computes its own way when the
        runner passes them apart (``fixed_from``); None: it computes every row alike."""
        ...

    def __call__(self, x: torch.Tensor, *, fixed_from: int | None = None) -> torch.Tensor:
        """``x`` as packed rows: those before ``fixed_from`` (decode rows, short
        prompts) each rounded as it would be alone; from it on (long prompts,
        ``PrefillChunk.fixed``) each rounded the same whatever else shares the step
        (None: every row as alone). Two kinds compute them otherwise: bf16 dense
        projections on AMX CPUs (in fixed-size calls, ``row_blocks``), and quantized
        ones with bf16 activations (on weights unpacked to bf16, ``Unpacked``)."""
        ...


@dataclass(frozen=True, slots=True)
class Dense:
    """The weight as loaded; on CPU in bf16, reordered once into oneDNN's blocked layout
    (what vLLM-CPU and inductor's freezing do), so no GEMM reorders it per call. Measured
    on an AMD EPYC: identical outputs, 0.5x (1 row) to 0.96x (300 rows) of ``F.linear``'s
    time. A bf16 CPU projection takes at most ``row_block`` rows per GEMM (``None``: any),
    the most with which every row rounds as it would alone (``row_blocks``: 32 on AMX
    CPUs, any elsewhere). Where it is capped, the rows of a long prompt run in calls of
    the sizes in ``prefill_sizes`` (multiples of 16 from 48 up to 512 rows on AMX, as
    the probe finds them): each rounds the same in any of them, and one such call costs far
    less than four capped ones. Rows that the widest size does not hold go in calls of
    it; the rest in one call of the narrowest that holds them, padded."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    prepacked: bool
    nbytes: int
    row_block: int | None = None
    prefill_sizes: tuple[int, ...] = ()  # none: a prompt's rows split like decode rows

    @classmethod
    def of(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, *, prompt_rows: bool = False
    ) -> Dense:
        """``prompt_rows``: the runner passes a long prompt's rows apart (``fixed_from``),
        so probe the sizes for them too; otherwise every row is taken as a decode row."""
        weight = weight.contiguous()
        size = _nbytes(weight)
        prepacked = _can_prepack(weight)
        stored = _pack(weight) if prepacked else weight
        block: int | None = None
        sizes: tuple[int, ...] = ()
        if weight.device.type == "cpu" and weight.dtype == torch.bfloat16:
            block, sizes = _row_blocks(weight, stored, prepacked, prompt_rows)
        return cls(stored, bias, prepacked, size, block, sizes)

    @property
    def prompt_tokens(self) -> int | None:
        """A prompt that needs more than one capped call and fills at least half the
        narrowest fixed-size one (33 tokens where 32-row calls cap and 64-row ones are
        probed). Measured on SmolLM2 (AMX Xeon, two threads): 33 / 50 / 63 tokens took 31.4
        / 32.7 / 35.2 ms in a 64-row call against 35.2 / 37.6 / 41.3 in 32-row calls,
        20 tokens 28.8 against 22.5; a 262- and a 40-token prompt in one step 116 ms
        against 138 with the short one's rows in 32-row calls."""
        if not self.prefill_sizes:
            return None
        return max((self.row_block or 0) + 1, self.prefill_sizes[0] // 2)

    def __call__(self, x: torch.Tensor, *, fixed_from: int | None = None) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        total = rows.shape[0]
        split = total if fixed_from is None or not self.prefill_sizes else fixed_from
        if self.row_block is None or (split == total and total <= self.row_block):
            return _dense(x, self.weight, self.bias, self.prepacked)
        parts = [
            self._call(rows[start : min(start + self.row_block, split)])
            for start in range(0, split, self.row_block)
        ]
        start = split
        while start < total:
            size = _call_size(self.prefill_sizes, total - start)
            part = rows[start : start + size]
            short = size - part.shape[0]
            if short:  # zero rows fill the call; their results are dropped
                part = torch.cat((part, part.new_zeros(short, part.shape[1])))
            parts.append(self._call(part)[: size - short])
            start += size
        # one call (a whole prompt chunk): its output as is; copying it took a 512-token
        # SmolLM2 prefill from 145 to 149-153 ms (120 copies of ~66 µs, torch.profiler)
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.reshape(*x.shape[:-1], -1)

    def _call(self, rows: torch.Tensor) -> torch.Tensor:
        return _dense(rows, self.weight, self.bias, self.prepacked)


def _nbytes(*tensors: torch.Tensor) -> int:
    """Bytes the tensors hold (a projection's ``nbytes``: what its kernel reads a call)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def _call_size(sizes: tuple[int, ...], rows: int) -> int:
    """Of ``sizes`` (ascending), the narrowest that holds ``rows``, else the widest."""
    return next((size for size in sizes if size >= rows), sizes[-1])


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


_ROW_BLOCKS: dict[tuple[int, int, bool, bool, int, bool], tuple[int | None, tuple[int, ...]]] = {}
"""Memo of :func:`_row_blocks` per weight shape and layout, thread count and ``prompt_rows``: a pure
function of the CPU, the shape and the calling thread's team size (the kernel oneDNN
picks depends on the shape, not the values, and how it splits a call over threads moves
some sums: on the AMX Xeon a 512-row call of SmolLM2's qkv rounds otherwise on two
threads than on one), so a race only computes it twice; a model has a handful of shapes,
and the memo stops growing at 256. The engine steps on the thread count it loads with
(a long prompt's steps are never the one-thread small steps of ``adaptive_threads``)."""

_PROBE_OUT_FEATURES = 8192
"""A wider weight is probed on its first 8,192 rows: how a GEMM groups and sums an input
row does not depend on how many outputs it has (checked on SmolLM2's 49,152-row LM head,
``tests/hf/test_hf_row_blocks.py``), and a 150k-row head probed whole takes seconds."""


def _row_blocks(
    weight: torch.Tensor, stored: torch.Tensor, prepacked: bool, prompt_rows: bool
) -> tuple[int | None, tuple[int, ...]]:
    """``invariant_width`` and, where that is capped and ``prompt_rows`` asks,
    ``fixed_widths`` of this bf16 CPU projection (``stored``: ``weight`` as the projection
    keeps it), probed once per shape (0.15-0.25 s each on SmolLM2; the LM head and LoRA
    matrices, never given a prompt's rows apart, skip the second)."""
    threads = torch.get_num_threads()
    # a transposed view (an unpacked int4 weight) may take another kernel than its copy
    layout = weight.is_contiguous()
    key = (int(weight.shape[0]), int(weight.shape[1]), prepacked, layout, threads, prompt_rows)
    if key in _ROW_BLOCKS:
        return _ROW_BLOCKS[key]
    packed = stored
    if key[0] > _PROBE_OUT_FEATURES:  # only a wide one is probed on a packed slice
        probe = weight[:_PROBE_OUT_FEATURES]
        probe = probe.contiguous() if layout else probe.t().contiguous().t()
        packed = _pack(probe) if prepacked else probe

    def call(x: torch.Tensor) -> torch.Tensor:
        return _dense(x, packed, None, prepacked)

    width = invariant_width(call, key[1])
    widths = (width, fixed_widths(call, key[1]) if width is not None and prompt_rows else ())
    if len(_ROW_BLOCKS) < 256:
        _ROW_BLOCKS[key] = widths
    return widths


@dataclass(frozen=True, slots=True)
class Int8:
    """int8 weight [out, in], one scale per output channel (the activations' dtype).

    With bf16 activations the rows of a prompt of ``UNPACKED_PROMPT_TOKENS`` or more take
    ``unpacked``, the weight as bf16 (``q * scale``, ``csrc/unpack.c``) in oneDNN's
    fixed-size calls: PyTorch's int8 kernel took 25 ms a SmolLM2 layer for 512 rows (3.2
    for 64), a bf16 GEMM 4.6."""

    weight: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor | None
    nbytes: int
    unpacked: Unpacked | None = None  # none: a long prompt's rows take the kernel too

    @classmethod
    def of(
        cls, weight: torch.Tensor, bias: torch.Tensor | None, *, prompt_rows: bool = False
    ) -> Int8:
        """``prompt_rows``: as ``Dense.of``; with bf16 weights, build ``unpacked``."""
        w = weight.detach().float()
        scales = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        scales = scales.to(weight.dtype)
        size = _nbytes(q, scales)
        kernel = load_glue() if prompt_rows and weight.dtype == torch.bfloat16 else None
        unpacked = None
        if kernel is not None and not isinstance(kernel, str):
            unpacked = Unpacked.of(functools.partial(kernel.int8_weights, q, scales), bias)
        return cls(q, scales, bias, size, unpacked)

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.unpacked is None else UNPACKED_PROMPT_TOKENS

    def __call__(self, x: torch.Tensor, *, fixed_from: int | None = None) -> torch.Tensor:
        return _split_rows(self._kernel, self.unpacked, x, fixed_from)

    def _kernel(self, rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int8pack_mm(rows, self.weight, self.scales)
        return out if self.bias is None else out + self.bias


def _split_rows(
    kernel: Callable[[torch.Tensor], torch.Tensor],
    unpacked: Unpacked | None,
    x: torch.Tensor,
    fixed_from: int | None,
) -> torch.Tensor:
    """``_split_prompt`` over ``x``'s rows (any leading shape), in ``x``'s shape."""
    out = _split_prompt(kernel, unpacked, x.reshape(-1, x.shape[-1]), fixed_from)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _split_prompt(
    kernel: Callable[[torch.Tensor], torch.Tensor],
    unpacked: Unpacked | None,
    rows: torch.Tensor,
    fixed_from: int | None,
) -> torch.Tensor:
    """Rows before ``fixed_from`` by ``kernel``, the rest (a long prompt's) by
    ``unpacked`` where there is one."""
    if fixed_from is None or unpacked is None or fixed_from >= rows.shape[0]:
        return kernel(rows)
    prompt = unpacked(rows[fixed_from:])
    return torch.cat((kernel(rows[:fixed_from]), prompt)) if fixed_from else prompt


@dataclass(frozen=True, slots=True)
class Int4:
    """int4 weight packed for the CPU kernel; per group of ``group`` inputs a scale and a
    zero, stored ``[in / group, out, 2]`` in the activations' dtype.

    With bf16 activations the rows of a prompt of ``UNPACKED_PROMPT_TOKENS`` or more take
    ``unpacked``: PyTorch's kernel dequantizes the weight groups again for every few rows
    (a 512-token SmolLM2 prefill took 4.8x bf16's time), while unpacking the weight to
    bf16 once per call (``csrc/unpack.c``, the values the kernel multiplies by, each
    rounded once to bf16) and one GEMM cost about what bf16 costs."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    group: int
    out_features: int
    bias: torch.Tensor | None
    nbytes: int
    unpacked: Unpacked | None = None  # none: a long prompt's rows take the kernel too

    @classmethod
    def of(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: int,
        *,
        prompt_rows: bool = False,
    ) -> Int4:
        """``prompt_rows``: as ``Dense.of``; with bf16 weights where this build's layout is
        the one ``csrc/unpack.c`` unpacks, build ``unpacked``."""
        out_features, in_features = weight.shape
        q, pairs = int4_values(weight, group)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        size = _nbytes(packed, pairs)
        unpacked = None
        unpack = _int4_unpacker(packed, pairs, in_features, group) if prompt_rows else None
        if unpack is not None:
            unpacked = Unpacked.of(unpack, bias)
        return cls(packed, pairs, group, out_features, bias, size, unpacked)

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.unpacked is None else UNPACKED_PROMPT_TOKENS

    def __call__(self, x: torch.Tensor, *, fixed_from: int | None = None) -> torch.Tensor:
        return _split_rows(self._kernel, self.unpacked, x, fixed_from)

    def _kernel(self, rows: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(
            rows, self.packed, self.group, self.scales_and_zeros
        )
        return out if self.bias is None else out + self.bias


def int4_values(weight: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` (``[out, in]``) on the int4 grid: q (int32 ``[out, in]``, 0..15) and per
    group of ``group`` inputs a scale and a zero (``[in / group, out, 2]`` in the weight's
    dtype), ``w ~= (q - 8) * scale + zero``."""
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
    zero = low + 8 * scale  # the kernels compute (q - 8) * scale + zero
    pairs = torch.stack((scale, zero), dim=-1).transpose(0, 1).contiguous().to(weight.dtype)
    return q, pairs


TILES_PROMPT_TOKENS = 256
"""Prompts from this long on run an ``Int4Tiles`` projection on its weight unpacked to
bf16. The tiles cost per row (each group's sums are scaled and added per row), the
unpacking per call: on SmolLM2's four layer shapes (AMX Xeon, two threads) the tiles
took 1.2 ms for 128 rows against 1.7 unpacked, 2.4 against 2.2 for 256, 4.8 against 3.7
for 512 (``docs/benchmarks/int4_tiles/``)."""


@dataclass(frozen=True, slots=True)
class Int4Tiles:
    """int4 weights multiplied on AMX tiles (``csrc/int4_amx.c``: the layout, the sums,
    why). Where this CPU has AMX (``Int4Tiles.of`` decides), ``int4`` takes it instead of
    ``Int4``: at 16 decode rows PyTorch's kernel took 3.7x its time on SmolLM2's layer
    shapes, and SmolLM2's int4 step 2.0x (``docs/benchmarks/int4_tiles/``). The same
    integers, scales and zeros as ``Int4``'s, with fp32 sums in another order: the results
    differ from PyTorch's kernel in the last bits, and each row's do not depend on the
    other rows of its call. A prompt of ``TILES_PROMPT_TOKENS`` or more takes ``unpacked``
    as ``Int4``'s does (the weight unpacked to bf16 per call, then bf16's fixed-size
    calls)."""

    kernel: Glue
    packed: torch.Tensor  # int16, csrc/int4_amx.c's layout
    scales_and_zeros: torch.Tensor  # bf16 [out / 32, in / group, 32, 2]: per unit
    group: int
    out_features: int
    bias: torch.Tensor | None
    nbytes: int
    unpacked: Unpacked | None = None  # none: a long prompt's rows take the tiles too

    @classmethod
    def of(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: int,
        *,
        prompt_rows: bool = False,
    ) -> Int4Tiles | None:
        """``weight`` for the tiles, or None where they cannot take it: not bf16 on CPU,
        outputs not a multiple of 32, groups not of 32 inputs or a multiple, no C build,
        or a CPU (or kernel) without AMX. ``prompt_rows``: as ``Dense.of``."""
        out_features, in_features = weight.shape
        fits = (
            weight.dtype == torch.bfloat16
            and weight.device.type == "cpu"
            and out_features % 32 == 0
            and group % 32 == 0
            and in_features % group == 0
        )
        kernel = load_glue() if fits else None
        if kernel is None or isinstance(kernel, str) or not _amx_ready(kernel):
            return None
        q, pairs = int4_values(weight, group)
        packed = pack_int4_tiles(q)
        per_unit = pairs.reshape(in_features // group, out_features // 32, 32, 2)
        scales = per_unit.transpose(0, 1).contiguous()
        size = _nbytes(packed, scales)
        detached = None if bias is None else bias.detach()
        unpacked = None
        if prompt_rows:

            def unpack() -> torch.Tensor:
                return kernel.int4_tiles_weights(packed, scales, in_features, group).t()

            unpacked = Unpacked.of(unpack, detached)
        return cls(kernel, packed, scales, group, out_features, detached, size, unpacked)

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.unpacked is None else TILES_PROMPT_TOKENS

    def __call__(self, x: torch.Tensor, *, fixed_from: int | None = None) -> torch.Tensor:
        return _split_rows(self._tiles, self.unpacked, x, fixed_from)

    def _tiles(self, rows: torch.Tensor) -> torch.Tensor:
        out = self.kernel.int4_amx_linear(rows, self.packed, self.scales_and_zeros, self.group)
        return out if self.bias is None else out + self.bias


@functools.cache
def _amx_ready(kernel: Glue) -> bool:
    return kernel.int4_amx_ready()


def pack_int4_tiles(q: torch.Tensor) -> torch.Tensor:
    """q (``[out, in]``, 0..15; out a multiple of 32, in of 32) in ``csrc/int4_amx.c``'s
    layout: per unit of 32 outputs, chunk of 32 inputs, tile of 16 outputs and vector v,
    16-bit lane 2j + e holding in nibble i the q of output j, input 8v + 2i + e."""
    out_features, in_features = q.shape
    parts = q.reshape(out_features // 32, 2, 16, in_features // 32, 4, 4, 2)
    lanes = parts.permute(0, 3, 1, 4, 2, 6, 5)  # unit, chunk, tile, v, j, e, i
    words = (lanes << torch.tensor([0, 4, 8, 12], dtype=q.dtype)).sum(dim=-1)
    return words.to(torch.int32).to(torch.uint16).view(torch.int16).reshape(-1).contiguous()


def _int4_unpacker(
    packed: torch.Tensor, pairs: torch.Tensor, in_features: int, group: int
) -> Callable[[], torch.Tensor] | None:
    """A call giving an ``Int4`` weight as bf16 ``[out, in]`` (a transposed view: the
    GEMM takes it as is), or None where the C kernels cannot: not bf16, outputs not a
    multiple of 64, no C build, or a PyTorch build whose layout is another."""
    if pairs.dtype != torch.bfloat16 or pairs.shape[1] % 64:
        return None
    kernel = load_glue()
    if isinstance(kernel, str) or not _int4pack_layout_known():
        return None

    def unpack() -> torch.Tensor:
        return kernel.int4pack_weights(packed, pairs, in_features, group).t()

    return unpack


@functools.cache
def _int4pack_layout_known() -> bool:
    """Whether this PyTorch build packs int4 as ``csrc/unpack.c`` unpacks it: random
    values packed and unpacked come back (once per process)."""
    kernel = load_glue()
    if isinstance(kernel, str):
        return False
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (128, 64), generator=gen, dtype=torch.int32)
    pairs = torch.randn(2, 128, 2, generator=gen).to(torch.bfloat16)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scale, zero = (pairs[..., i].float().repeat_interleave(32, dim=0).t() for i in (0, 1))
    want = ((q - 8).float() * scale + zero).to(torch.bfloat16)
    got = kernel.int4pack_weights(packed, pairs, 64, 32).t()
    return bool(torch.equal(got, want))


INT_DOT_GROUP = 32  # inputs per weight scale and per activation scale (GGUF's block)
_TILE = 16  # outputs per tile of the integer-dot kernel: one vector of results
INT_DOT_SCHEMES: dict[Scheme, tuple[int, bool]] = {  # weight bits, 16-bit activations
    "w4a8": (4, False),
    "w4a16": (4, True),
    "w8a16": (8, True),
}


@dataclass(frozen=True, slots=True)
class Unpacked:
    """How an integer-dot projection takes a long prompt's rows (bf16 activations): its
    weight unpacked to bf16 per call (``w = q * s + m``, the values the integer kernel
    multiplies by, each rounded once to bf16), then oneDNN's bf16 GEMM in the calls
    ``Dense`` makes for a prompt's rows (``row_block``, ``sizes``: probed on the unpacked
    weight, as it is called: not reordered). The activations are not rounded to
    integers here: these rows compute as a bf16 model with the quantized weights would.
    Each row's result does not depend on the other rows of its call (``row_blocks``)."""

    unpack: Callable[[], torch.Tensor]  # the whole weight, bf16 [out, in]
    bias: torch.Tensor | None  # bf16
    row_block: int | None
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, unpack: Callable[[], torch.Tensor], bias: torch.Tensor | None) -> Unpacked:
        """The calls for ``unpack``'s weight, probed once on a weight it gives."""
        whole = unpack()
        blocks = _row_blocks(whole, whole, False, True)
        return cls(unpack, None if bias is None else bias.detach(), *blocks)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        dense = Dense(self.unpack(), self.bias, False, 0, self.row_block, self.sizes)
        return dense(rows, fixed_from=0)


@dataclass(frozen=True, slots=True)
class IntDot:
    """Integer weights times integer activations (``csrc/int_dot.c`` says how and why).

    Weights, per output and group of 32 inputs, with fp16 scales: 4 bits ``w ~= q * s + m``
    (q in 0..15 spanning the group's min..max, GGUF Q4_1's grid), or 8 bits ``w ~= q * s``
    (q in -127..127, Q8_0's); ``packed`` in the kernel's tile layout. Each call rounds its
    activations per row and group (``x ~= d * a``): to int8 (a in -127..127, Q8_1's
    grid), or with ``wide`` to 16 bits (finer than bf16 for any value above 1/128 of its
    group's largest). The dot products are exact integers, so a row's result does not
    depend on the other rows of its call. Runs on bf16 or fp32 activations, CPU.

    With bf16 activations the rows of a prompt of ``UNPACKED_PROMPT_TOKENS`` or more take
    ``unpacked`` instead: the integer kernel's time grows with the rows (it re-reads
    every weight group per 4 rows), oneDNN's AMX GEMM's far less, and unpacking the
    weight once per call costs about a third of a 64-row call of the kernel."""

    packed: torch.Tensor
    in_features: int
    out_features: int
    bias: torch.Tensor | None  # fp32
    bits: int
    wide: bool
    call: IntDotCall  # the kernel bound to ``packed`` and ``bias``
    nbytes: int
    unpacked: Unpacked | None = None  # none: a long prompt's rows take the kernel too

    @classmethod
    def of(
        cls,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        bits: int,
        wide: bool,
        *,
        prompt_rows: bool = False,
    ) -> IntDot:
        """``prompt_rows``: as ``Dense.of``; with bf16 weights, build ``unpacked``."""
        out_features, in_features = weight.shape
        if in_features % INT_DOT_GROUP or out_features % _TILE:
            raise QuantizationError(
                f"integer-dot weights need the input width ({in_features}) to be a multiple "
                f"of {INT_DOT_GROUP} and the output width ({out_features}) of {_TILE}"
            )
        if weight.dtype not in (torch.bfloat16, torch.float32):
            raise QuantizationError(
                f"integer-dot weights run bf16 or fp32 activations, not {weight.dtype}"
            )
        kernel = load_glue()
        if isinstance(kernel, str):
            raise QuantizationError(f"integer-dot weights need the C kernels, which are {kernel}")
        packed = pack_int4(weight) if bits == 4 else pack_int8(weight)
        fp32_bias = None if bias is None else bias.detach().float().contiguous()
        call = kernel.int_dot(packed, in_features, out_features, fp32_bias, bits=bits, wide=wide)
        unpacked = None
        if prompt_rows and weight.dtype == torch.bfloat16:
            unpack = functools.partial(
                kernel.int_dot_weights, packed, in_features, 0, out_features, bits=bits
            )
            unpacked = Unpacked.of(unpack, bias)
        size = _nbytes(packed)
        return cls(packed, in_features, out_features, fp32_bias, bits, wide, call, size, unpacked)

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.unpacked is None else UNPACKED_PROMPT_TOKENS

    def __call__(self, x: torch.Tensor, *, fixed_from: int | None = None) -> torch.Tensor:
        if x.dim() == 2 and x.stride(1) == 1:  # the runner's case: no reshapes
            return self._rows(x, fixed_from)
        rows = x.reshape(-1, self.in_features)
        out = self._rows(rows if rows.stride(-1) == 1 else rows.contiguous(), fixed_from)
        return out.reshape(*x.shape[:-1], self.out_features)

    def _rows(self, rows: torch.Tensor, fixed_from: int | None) -> torch.Tensor:
        return _split_prompt(self.call, self.unpacked, rows, fixed_from)


def int4_grid(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q, s, m)`` of ``weight`` ``[out, in]`` on the 4-bit grid: q uint8
    ``[out, in / 32, 32]``, s and m fp16 ``[out, in / 32]``; q rounds to nearest against the
    fp16 s and m it is stored with (a group of equal weights: s = 0, q = 0)."""
    grouped = _groups(weight)
    low, high = grouped.amin(dim=-1), grouped.amax(dim=-1)
    s, m = ((high - low) / 15).to(torch.float16), low.to(torch.float16)
    step, low16 = s.float(), m.float()
    q = torch.round((grouped - low16[..., None]) / _nonzero(step)[..., None]).clamp(0, 15)
    q = torch.where(step[..., None] > 0, q, torch.zeros_like(q))
    return q.to(torch.uint8), s, m


def int8_grid(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, s)`` of ``weight`` on the 8-bit grid: q int8 ``[out, in / 32, 32]`` in
    -127..127, s fp16 ``[out, in / 32]`` (q rounds against the fp16 s)."""
    grouped = _groups(weight)
    s = (grouped.abs().amax(dim=-1) / 127).to(torch.float16)
    q = torch.round(grouped / _nonzero(s.float())[..., None]).clamp(-127, 127)
    return q.to(torch.int8), s


def pack_int4(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` on the 4-bit grid in the kernel's layout: per tile of 16 outputs and
    group of 32 inputs, 4 x 64 bytes of nibbles (byte 4j + e of chunk u: q[j][4u + e] low,
    q[j][4u + 16 + e] high), then s[16], then m[16]."""
    q, s, m = int4_grid(weight)
    tiles, groups = s.shape[0] // _TILE, s.shape[1]
    by_tile = q.reshape(tiles, _TILE, groups, INT_DOT_GROUP).transpose(1, 2)  # t g j i
    low = by_tile[..., :16].reshape(tiles, groups, _TILE, 4, 4)
    high = by_tile[..., 16:].reshape(tiles, groups, _TILE, 4, 4)
    nibbles = (low | (high << 4)).permute(0, 1, 3, 2, 4).reshape(tiles, groups, 256)
    return torch.cat((nibbles, _per_tile(s), _per_tile(m)), dim=-1).contiguous()


def pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` on the 8-bit grid in the kernel's layout: per tile of 16 outputs and
    group of 32 inputs, 8 x 64 bytes (byte 4j + e of step t: q[j][4t + e] + 128), then
    s[16]."""
    q, s = int8_grid(weight)
    tiles, groups = s.shape[0] // _TILE, s.shape[1]
    shifted = (q.to(torch.int16) + 128).to(torch.uint8)
    by_tile = shifted.reshape(tiles, _TILE, groups, 8, 4).permute(0, 2, 3, 1, 4)  # t g step j e
    return torch.cat((by_tile.reshape(tiles, groups, 512), _per_tile(s)), dim=-1).contiguous()


def _groups(weight: torch.Tensor) -> torch.Tensor:
    out_features, in_features = weight.shape
    return weight.detach().float().reshape(out_features, in_features // INT_DOT_GROUP, -1)


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _per_tile(values: torch.Tensor) -> torch.Tensor:
    """fp16 ``[out, groups]`` as the bytes of each tile's group: ``[tiles, groups, 32]``."""
    out_features, groups = values.shape
    tiles = out_features // _TILE
    ordered = values.reshape(tiles, _TILE, groups).transpose(1, 2).contiguous()
    return ordered.view(torch.uint8).reshape(tiles, groups, 2 * _TILE)


def make_linear(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scheme: Scheme,
    group: int = 32,
    *,
    prompt_rows: bool = False,
) -> Linear:
    """The projection ``weight`` (``[out, in]``) as ``scheme`` asks; ``prompt_rows``: see
    ``Dense.of``."""
    if scheme == "none":
        return Dense.of(weight, bias, prompt_rows=prompt_rows)
    if weight.device.type != "cpu":
        raise QuantizationError(
            f"{scheme} weights run on CPU only (the model is on {weight.device})"
        )
    if scheme == "int8":
        return Int8.of(weight, bias, prompt_rows=prompt_rows)
    if scheme in INT_DOT_SCHEMES:
        bits, wide = INT_DOT_SCHEMES[scheme]
        return IntDot.of(weight, bias, bits, wide, prompt_rows=prompt_rows)
    return Int4Tiles.of(weight, bias, group, prompt_rows=prompt_rows) or Int4.of(
        weight, bias, group, prompt_rows=prompt_rows
    )


def _can_prepack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )
