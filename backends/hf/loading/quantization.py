"""Which projections the packed runner quantizes, and how: the model's ``quantization:``
read at load into a ``QuantPlan`` (``quant_plan``).

``int8`` / ``int4``: every layer projection at that width; ``gguf``: each projection at
the width nearest to what the GGUF file stores it in, read from the file's tensor types:
4-bit and smaller types take int4 (the file's own group of 32), 5- to 8-bit types int8,
float types stay dense; the LM head stays as loaded either way (``DecoderRunner``).
``w4a8``: a plan of its own (``W4A8``), its LM head included. A fused
projection (Q, K and V; gate and up) takes the widest of its parts. The weights
themselves come from the loaded model (transformers dequantizes the GGUF at load) and
are quantized again on our grid: a Q4_0 block and our int4 group cover the same 32
inputs, but the values are rounded anew (``docs/hf.md``, Quantized weights).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from backends.hf.loading.loader import ModelLoadError
from backends.hf.loading.model_source import gguf_behind
from config.schema import HFModelConfig

# One projection's kind (``model.linears``); w4a16 and w8a16 occur only inside w4a8's plan.
Scheme = Literal["none", "int8", "int4", "w4a8", "w4a16", "w8a16"]
PARTS = ("qkv", "o", "gate_up", "down")
_GGUF_PARTS = {
    "attn_q": "qkv",
    "attn_k": "qkv",
    "attn_v": "qkv",
    "attn_qkv": "qkv",
    "attn_output": "o",
    "ffn_gate": "gate_up",
    "ffn_up": "gate_up",
    "ffn_gate_up": "gate_up",
    "ffn_down": "down",
}
_INT4_TYPES = {"Q4_0", "Q4_1", "Q4_K", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS"}
_INT8_TYPES = {"Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_1", "Q8_K"}
_WIDTH: dict[Scheme, int] = {"int4": 0, "int8": 1, "none": 2}  # what ``_nearest`` gives


@dataclass(frozen=True, slots=True)
class QuantPlan:
    """The scheme of each projection; built once at load, read-only."""

    default: Scheme
    group: int = 32
    parts: Mapping[tuple[int, str], Scheme] = field(default_factory=dict)
    described: str = ""
    by_part: Mapping[str, Scheme] = field(default_factory=dict)  # before ``default``
    head: Scheme = "none"  # the LM head's (``DecoderRunner``)

    def scheme(self, layer: int, part: str) -> Scheme:
        return self.parts.get((layer, part)) or self.by_part.get(part, self.default)

    @property
    def quantized(self) -> bool:
        return self.default != "none" or any(s != "none" for s in self.parts.values())


NONE = QuantPlan(default="none", described="bf16/fp32 weights as loaded")


def quant_plan(config: HFModelConfig) -> QuantPlan:
    """The model's ``quantization:`` as a plan (reads a GGUF's header for ``gguf``)."""
    if config.quantization == "gguf":
        gguf = gguf_behind(config.source)
        if gguf is None:
            raise ModelLoadError(
                f"{config.name}: quantization 'gguf' needs a GGUF source, not {config.source!r}"
            )
        return from_gguf(gguf)
    return uniform(config.quantization, config.quantization_group_size)


def uniform(scheme: Scheme, group: int) -> QuantPlan:
    """Every layer projection at ``scheme`` and the LM head as loaded (``DecoderRunner``);
    w4a8 is a plan of its own (``W4A8``)."""
    if scheme == "none":
        return NONE
    if scheme == "w4a8":
        return W4A8
    detail = f"int4, groups of {group}" if scheme == "int4" else "int8 per output channel"
    return QuantPlan(
        default=scheme,
        group=group,
        described=f"{detail}; LM head, embeddings and norms as loaded",
    )


W4A8 = QuantPlan(
    default="w4a8",
    group=32,
    # Q, K and V round their activations to 16 bits, not 8: at 8 they cost SmolLM2 5.5
    # points of greedy first-token agreement with bf16 (91.0 % against int4's 96.5 %;
    # with Q, K and V alone left at int4 it agreed as int4 does, 96.5 %).
    by_part={"qkv": "w4a16"},
    # The LM head at 8-bit weights (Q8_0's grid, what the packaged Q4_1 GGUF stores it
    # in) with 16-bit activations: in bf16 it was 56 of the 122 MB a 1-row step read,
    # and the step took 3.5-4 ms less without it (1.2 ms when timed alone). 8-bit
    # weights agreed as bf16 did (emulated, 96.5 % either way); 4-bit ones did not (78 %).
    head="w8a16",
    described="w4a8: 4-bit weights (Q4_1's grid) in groups of 32 x activations rounded "
    "to int8 (Q, K and V: to 16 bits); LM head 8-bit weights (Q8_0's grid) x 16-bit "
    "activations; embeddings and norms as loaded",
)


def from_gguf(path: Path) -> QuantPlan:
    """The plan nearest to ``path``'s own tensor types."""
    types = tensor_types(path)
    parts: dict[tuple[int, str], Scheme] = {}
    for name, kind in types.items():
        pieces = name.split(".")
        if len(pieces) < 3 or pieces[0] != "blk" or pieces[2] not in _GGUF_PARTS:
            continue
        key = (int(pieces[1]), _GGUF_PARTS[pieces[2]])
        scheme = _nearest(kind)
        if key not in parts or _WIDTH[scheme] > _WIDTH[parts[key]]:
            parts[key] = scheme
    counts = Counter(parts.values())
    stored = Counter(kind for name, kind in types.items() if name.startswith("blk."))
    described = (
        f"from the GGUF's types ({', '.join(f'{k} x{n}' for k, n in sorted(stored.items()))}): "
        f"{counts['int4']} projections int4 (groups of 32), {counts['int8']} int8, "
        f"{counts['none']} dense; LM head, embeddings and norms as loaded"
    )
    return QuantPlan(default="none", group=32, parts=parts, described=described)


def _nearest(kind: str) -> Scheme:
    if kind in _INT4_TYPES:
        return "int4"
    if kind in _INT8_TYPES:
        return "int8"
    return "none"


# GGUF metadata value types with a fixed width (the format's numbering); 8 is a string,
# 9 an array.
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def tensor_types(path: Path) -> dict[str, str]:
    """Each tensor's storage type (``Q4_K``, ``F32``, ...) from a GGUF file's header.
    Read directly: the ``gguf`` package's reader also decodes every metadata array (a
    262k-entry vocabulary takes it ~a minute on 2 cores); this skips them."""
    from gguf import GGMLQuantizationType

    with path.open("rb") as handle:
        magic, _version, tensors, entries = struct.unpack("<4sIQQ", handle.read(24))
        if magic != b"GGUF":
            raise ValueError(f"{path.name} is not a GGUF file")
        for _ in range(entries):
            _string(handle)
            _skip_value(handle, _u32(handle))
        types = {}
        for _ in range(tensors):
            name = _string(handle)
            dims = _u32(handle)
            handle.seek(8 * dims, 1)
            kind = _u32(handle)
            handle.seek(8, 1)  # offset
            types[name] = GGMLQuantizationType(kind).name
    return types


def _u32(handle: BinaryIO) -> int:
    return int(struct.unpack("<I", handle.read(4))[0])


def _u64(handle: BinaryIO) -> int:
    return int(struct.unpack("<Q", handle.read(8))[0])


def _string(handle: BinaryIO) -> str:
    return handle.read(_u64(handle)).decode("utf-8", errors="replace")


def _skip_value(handle: BinaryIO, kind: int) -> None:
    if kind in _FIXED:
        handle.seek(_FIXED[kind], 1)
    elif kind == 8:
        handle.seek(_u64(handle), 1)
    elif kind == 9:
        item, count = _u32(handle), _u64(handle)
        if item in _FIXED:
            handle.seek(_FIXED[item] * count, 1)
        else:
            for _ in range(count):
                _skip_value(handle, item)
    else:
        raise ValueError(f"unknown GGUF metadata type {kind}")
