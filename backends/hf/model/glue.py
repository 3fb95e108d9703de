"""The packed runner's element-wise glue as one C call each: RMSNorm, residual add +
RMSNorm, RoPE with the layer's KV-cache write and SiLU(gate) * up, and its decode
attention (one row's keys in place, in one fixed order), for bf16 on CPU
(``csrc/glue.c``); the w4a8 integer-dot projection kernel (``csrc/int_dot.c``: 4- or
8-bit weights times activations rounded to 8- or 16-bit integers; used by
``linears.IntDot``); the unpacking of PyTorch's int8 and int4 weights to bf16 for a
long prompt's rows (``csrc/unpack.c``; ``linears.Int8``, ``linears.Int4``); and int4
projections on AMX tiles (``csrc/int4_amx.c``; ``linears.Int4Tiles``).

Why: at one to sixteen decode rows each framework op of a SmolLM2 step costs microseconds
of dispatch and allocation around a pass over a few hundred values, and the glue between
the projections is most of a step's ops: one RMSNorm is ~13 µs in PyTorch (upcast,
square, mean, rsqrt, multiply, round, weight multiply), ~3 µs here. The kernels round as
the framework ops they replace (RoPE and the residual add bitwise), except in two fp32
details before the final bf16 rounding: the norm's sum of squares runs in another fixed
order than PyTorch's, and SiLU's exponential is a polynomial of its own. Each row is
computed alone, so a sequence's bits do not depend on the batch it is in. A call splits
its rows over the calling thread's OpenMP team from 8,192 values (a prefill chunk's, or
a 16-row decode step's on SmolLM2; one thread took a 512-row SiLU * up in 0.70 ms against
the framework's 0.30 on two, 0.36 split), the integer dots always, the attention from 512
keys; a one-row step's small calls stay on one thread.

Built by ``make install`` (``python -m backends.hf.model.glue --build``) into the
environment (``<sys.prefix>/lib/llmso``), under a name that hashes the source and flags,
so a stale build is never loaded (and a new build deletes the earlier ones). The engine
never compiles at load: without the library (no C compiler when installing, another
environment) it runs the framework ops and says why at load. Loaded with ``ctypes``,
which also releases the GIL for the call. The loaded library is cached per process
(``load``); it holds no state.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

_CSRC = Path(__file__).with_name("csrc")
SOURCES = (_CSRC / "glue.c", _CSRC / "int_dot.c", _CSRC / "unpack.c", _CSRC / "int4_amx.c")
HEADERS = (_CSRC / "bf16.h",)
FLAGS = (
    "-O3",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-ffp-contract=off",  # no fused multiply-adds: every ISA clone rounds alike
    "-fno-math-errno",
    "-fno-trapping-math",  # lets the clamps and NaN checks vectorize; same values
    "-fopenmp",  # int_dot splits outputs over the calling thread's team (PyTorch's libgomp)
)
_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float
_C = ctypes.c_int
_SIGNATURES = {
    "llmso_rms_norm": (_P, _I, _P, _P, _I, _I, _F),
    "llmso_add_rms_norm": (_P, _P, _P, _P, _P, _I, _I, _F),
    "llmso_rope_store": (_P, _I, _P, _I, _I, _I, _I, _I, _P, _P, _P, _P, _P, _P, _I),
    "llmso_silu_mul": (_P, _P, _I, _I),
    "llmso_decode_attention": (_P, _P, _P, _I, _I, _I, _P, _I, _I, _I, _I, _F, _P, _C),
    "llmso_int_dot_linear": (_P, _I, _I, _C, _P, _I, _I, _P, _P, _C, _C, _C),
    "llmso_int_dot_isa": (),
    "llmso_int_dot_dequantize": (_P, _I, _I, _I, _C, _P, _C),
    "llmso_int4pack_weights": (_P, _P, _I, _I, _I, _P),
    "llmso_int8_weights": (_P, _P, _I, _I, _P),
    "llmso_int4_amx_ready": (),
    "llmso_int4_amx_linear": (_P, _I, _I, _P, _P, _I, _I, _I, _P),
    "llmso_int4_tiles_weights": (_P, _P, _I, _I, _I, _P),
}
_RETURNS_INT = {
    "llmso_int_dot_linear",
    "llmso_int_dot_isa",
    "llmso_decode_attention",
    "llmso_int4_amx_ready",
    "llmso_int4_amx_linear",
}


def library_path() -> Path:
    """Where this environment's build of the current source lives."""
    text = b"".join(source.read_bytes() for source in (*SOURCES, *HEADERS))
    digest = hashlib.sha256(text + " ".join(FLAGS).encode()).hexdigest()[:12]
    return Path(sys.prefix) / "lib" / "llmso" / f"libllmso_glue-{digest}.so"


def build(compiler: str | None = None) -> Path:
    """Compile the library into ``library_path()`` unless it is there, and delete the
    builds of earlier sources beside it."""
    target = library_path()
    if not target.exists():
        _compile(target, compiler)
    _remove_stale(target)
    return target


def _compile(target: Path, compiler: str | None) -> None:
    """Compile into ``target`` atomically (a partial build never has its name)."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise FileNotFoundError("no C compiler (cc or gcc) on PATH; set CC")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        subprocess.run(
            [cc, *FLAGS, *map(str, SOURCES), "-o", str(partial), "-lm"],
            check=True,
            timeout=300,
        )
        partial.replace(target)


def _remove_stale(current: Path) -> None:
    """Delete this environment's builds of earlier sources (nothing loads them: the name
    hashes the source). A process that has one loaded keeps its mapping."""
    for old in current.parent.glob("libllmso_glue-*.so"):
        if old != current:
            old.unlink(missing_ok=True)


@dataclass(frozen=True)
class Glue:
    """The loaded kernels. Arguments are bf16 CPU tensors; outputs are new tensors."""

    lib: ctypes.CDLL

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """LlamaRMSNorm of each row of 2-D ``x`` (rows may be strided)."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        rows, hidden = x.shape
        out = torch.empty((rows, hidden), dtype=x.dtype)
        self.lib.llmso_rms_norm(
            x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(), rows, hidden, eps
        )
        return out

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x + residual, RMSNorm(x + residual))`` for contiguous 2-D rows."""
        x, residual = x.contiguous(), residual.contiguous()
        rows, hidden = x.shape
        total = torch.empty_like(x)
        out = torch.empty_like(x)
        self.lib.llmso_add_rms_norm(
            x.data_ptr(),
            residual.data_ptr(),
            weight.data_ptr(),
            total.data_ptr(),
            out.data_ptr(),
            rows,
            hidden,
            eps,
        )
        return total, out

    def rope_store(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor, int],
        cache: tuple[torch.Tensor, torch.Tensor],
        write_rows: torch.Tensor,
    ) -> torch.Tensor:
        """RoPE of the queries and keys of ``qk`` (``[rows, heads +
        kv_heads, head_dim]``, rows may be strided), the rotated keys and the values (``v
        [rows, kv_heads, head_dim]``) written to rows ``write_rows`` (int64, token-major
        then kv head) of one layer's contiguous K/V ``cache``; returns the rotated queries
        ``[rows, heads, head_dim]``. ``rope``: one ``rotary``-wide cos / signed-sin row per
        token (contiguous) and ``rotary``, the features rotated of a head's first."""
        rows, all_heads, head_dim = qk.shape
        kv_heads = v.shape[1]
        k_cache, v_cache = cache
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            raise ValueError("rope_store writes into a contiguous cache")
        if write_rows.dtype != torch.int64 or write_rows.numel() != rows * kv_heads:
            raise ValueError("rope_store needs one int64 cache row per token and kv head")
        if qk.stride(2) != 1 or qk.stride(1) != head_dim:
            qk = qk.contiguous()
        if v.stride(2) != 1 or v.stride(1) != head_dim:
            v = v.contiguous()
        cos, sin_signed, rotary = rope
        q = torch.empty((rows, all_heads - kv_heads, head_dim), dtype=qk.dtype)
        self.lib.llmso_rope_store(
            qk.data_ptr(),
            qk.stride(0),
            v.data_ptr(),
            v.stride(0),
            all_heads - kv_heads,
            kv_heads,
            head_dim,
            rotary,
            cos.contiguous().data_ptr(),
            sin_signed.contiguous().data_ptr(),
            q.data_ptr(),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            write_rows.contiguous().data_ptr(),
            rows,
        )
        return q

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``SiLU(gate) * up`` for rows of ``[gate | up]``."""
        gate_up = gate_up.contiguous()
        rows, width = gate_up.shape
        out = torch.empty((rows, width // 2), dtype=gate_up.dtype)
        self.lib.llmso_silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
        return out

    def decode_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        bounds: torch.Tensor,
        scale: float,
        *,
        portable: bool = False,
    ) -> torch.Tensor:
        """Row ``d``'s query (``q [D, heads, hd]``) over positions ``bounds[d, 0]`` to
        ``bounds[d, 1]`` (int64, contiguous) of slot ``d`` of one layer's cache (``k``/``v``
        ``[slots, kv_heads, positions, hd]``, views or the whole cache: only the bounded
        positions of the first ``D`` slots are read; features contiguous, equal strides);
        ``[D, heads * hd]``. ``portable`` forces the scalar loops where the AVX512 path
        would run (tests)."""
        rows, heads, hd = q.shape
        if k.stride(3) != 1 or v.stride() != k.stride():
            raise ValueError("the cache views need contiguous features and equal strides")
        if not q.is_contiguous():
            q = q.contiguous()
        out = torch.empty((rows, heads * hd), dtype=q.dtype)
        slot_stride, head_stride, pos_stride, _ = k.stride()
        failed = self.lib.llmso_decode_attention(
            q.data_ptr(),
            k.data_ptr(),
            v.data_ptr(),
            slot_stride,
            head_stride,
            pos_stride,
            bounds.data_ptr(),
            rows,
            heads,
            k.shape[1],
            hd,
            scale,
            out.data_ptr(),
            int(portable),
        )
        if failed:
            raise MemoryError(f"decode_attention: no memory for {rows} rows' scores")
        return out

    @functools.cached_property
    def int_dot_isa(self) -> int:
        """The integer-dot kernel this CPU runs: 2 AVX512-VNNI, 0 the portable loop."""
        return int(self.lib.llmso_int_dot_isa())

    def int_dot(
        self,
        packed: torch.Tensor,
        in_features: int,
        out_features: int,
        bias: torch.Tensor | None,
        *,
        bits: int,
        wide: bool,
        isa: int | None = None,
    ) -> IntDotCall:
        """A ``linears.IntDot`` weight of ``bits`` (plus ``bias``, fp32, if any) bound to
        the kernel, with activations rounded to 16-bit integers (``wide``) or 8-bit;
        ``isa`` 0 forces the portable loop (tests)."""
        return IntDotCall(
            self.lib.llmso_int_dot_linear,
            (packed, bias),
            packed.data_ptr(),
            in_features,
            out_features,
            None if bias is None else bias.data_ptr(),
            bits,
            int(wide),
            self.int_dot_isa if isa is None else isa,
        )

    def int_dot_weights(
        self,
        packed: torch.Tensor,
        in_features: int,
        first: int,
        count: int,
        *,
        bits: int,
        isa: int | None = None,
    ) -> torch.Tensor:
        """Outputs ``[first, first + count)`` of a ``linears.IntDot`` weight of ``bits``
        as bf16 ``[count, in_features]`` (multiples of 16; ``isa`` 0 forces the
        portable loop)."""
        out = torch.empty((count, in_features), dtype=torch.bfloat16)
        self.lib.llmso_int_dot_dequantize(
            packed.data_ptr(),
            in_features,
            first // 16,
            count // 16,
            bits,
            out.data_ptr(),
            self.int_dot_isa if isa is None else isa,
        )
        return out

    def int4pack_weights(
        self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, group: int
    ) -> torch.Tensor:
        """A ``linears.Int4`` weight (PyTorch's CPU int4 layout, ``csrc/unpack.c``; a
        multiple of 64 outputs) as bf16 ``[in_features, out_features]``: the weight
        transposed, ``w = (q - 8) * scale + zero`` rounded once."""
        out_features = scales_and_zeros.shape[1]
        if out_features % 64 or in_features % group or scales_and_zeros.dtype != torch.bfloat16:
            raise ValueError("int4pack_weights: 64n outputs, groups dividing the inputs, bf16")
        out = torch.empty((in_features, out_features), dtype=torch.bfloat16)
        self.lib.llmso_int4pack_weights(
            packed.contiguous().data_ptr(),
            scales_and_zeros.contiguous().data_ptr(),
            out_features,
            in_features,
            group,
            out.data_ptr(),
        )
        return out

    def int4_amx_ready(self) -> bool:
        """Whether this CPU and Linux let ``int4_amx_linear`` run (AMX-BF16 and AVX512-BF16,
        the tile state granted to this process)."""
        return bool(self.lib.llmso_int4_amx_ready())

    def int4_amx_linear(
        self, rows: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int
    ) -> torch.Tensor:
        """``rows`` (bf16 ``[m, in]``, rows may be strided) times a ``linears.Int4Tiles``
        weight (``csrc/int4_amx.c``'s layout, its scales and zeros per unit), ``[m, out]``
        bf16, no bias. Only where ``int4_amx_ready()`` said yes."""
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        m, in_features = rows.shape
        out_features = scales_and_zeros.shape[0] * scales_and_zeros.shape[2]
        out = torch.empty((m, out_features), dtype=torch.bfloat16)
        if m == 0:
            return out
        failed = self.lib.llmso_int4_amx_linear(
            rows.data_ptr(),
            rows.stride(0),
            m,
            packed.data_ptr(),
            scales_and_zeros.data_ptr(),
            out_features,
            in_features,
            group,
            out.data_ptr(),
        )
        if failed:
            raise MemoryError("int4_amx_linear: out of memory for its buffers")
        return out

    def int4_tiles_weights(
        self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, group: int
    ) -> torch.Tensor:
        """A ``linears.Int4Tiles`` weight as bf16 ``[in_features, out_features]``: the
        weight transposed, ``w = (q - 8) * scale + zero`` rounded once."""
        out_features = scales_and_zeros.shape[0] * scales_and_zeros.shape[2]
        out = torch.empty((in_features, out_features), dtype=torch.bfloat16)
        self.lib.llmso_int4_tiles_weights(
            packed.data_ptr(),
            scales_and_zeros.data_ptr(),
            out_features,
            in_features,
            group,
            out.data_ptr(),
        )
        return out

    def int8_weights(self, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """A ``linears.Int8`` weight (int8 ``[out, in]``, one bf16 scale an output) as bf16
        ``[out, in]``: ``q * scale``, rounded once."""
        if q.dtype != torch.int8 or scales.dtype != torch.bfloat16:
            raise ValueError("int8_weights: int8 weights and bf16 scales")
        out = torch.empty(q.shape, dtype=torch.bfloat16)
        self.lib.llmso_int8_weights(
            q.contiguous().data_ptr(), scales.contiguous().data_ptr(), *q.shape, out.data_ptr()
        )
        return out


@dataclass(frozen=True)
class IntDotCall:
    """One packed weight bound to the integer-dot kernel: the call's arguments that never
    change, taken once (a SmolLM2 decode step makes ~120 such calls, and every Python
    operation in them shows in the step). Holds the tensors its pointers point into."""

    function: Callable[..., int]  # the ctypes function
    owned: tuple[torch.Tensor | None, ...]
    weight: int
    in_features: int
    out_features: int
    bias: int | None
    bits: int
    wide: int
    isa: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: 2-D, bf16 or fp32, contiguous features (rows may be strided)."""
        rows = x.shape[0]
        out = torch.empty((rows, self.out_features), dtype=x.dtype)
        failed = self.function(
            x.data_ptr(),
            rows,
            x.stride(0),
            x.dtype == torch.float32,
            self.weight,
            self.in_features,
            self.out_features,
            self.bias,
            out.data_ptr(),
            self.bits,
            self.wide,
            self.isa,
        )
        if failed:
            raise MemoryError(f"int_dot: no memory for {rows} rows' rounded activations")
        return out


@functools.cache
def load() -> Glue | str:
    """The built library, or why there is none (the caller runs the framework ops)."""
    path = library_path()
    if not path.exists():
        return f"not built for this source in {path.parent} (make install builds it)"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        return f"cannot load {path}: {exc}"
    for name, argtypes in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int if name in _RETURNS_INT else None
    return Glue(lib)


class GlueNorm:
    """A ``Norm`` (``norm(x, weight)``) over the glue's RMSNorm. Stateless."""

    def __init__(self, glue: Glue, eps: float):
        self.glue = glue
        self.eps = eps

    def __call__(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self.glue.rms_norm(x, weight, self.eps)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="compile the library")
    args = parser.parse_args(argv)
    if args.build:
        try:
            print(f"C glue kernels: {build()}")
        except (OSError, subprocess.SubprocessError) as exc:
            # Serving works without them (the framework ops run), so installing goes on.
            print(f"C glue kernels not built ({exc}); the engine runs without them")
    else:
        found = load()
        print(found if isinstance(found, str) else f"built: {library_path()}")


if __name__ == "__main__":
    main()
