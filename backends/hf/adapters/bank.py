"""LoRA adapters in the packed runner: every adapter's delta for a whole mixed step.

A LoRA adapter adds ``scaling * B @ A`` to some projections (``A``: ``[r, in]``, ``B``:
``[out, r]``). Requests for different adapters, and for the bare base model, share one
packed step; no adapter is merged into the base weights. Per fused projection of a layer
(QKV, O, gate/up, down) the bank stacks every adapter's ``A`` into one ``[k*S*R, in]``
matrix, ``S`` adapters of rank at most ``R`` for each of the ``k`` parts the projection
joins (q, k and v; gate and up), and per part every adapter's scaled ``B`` into one
``[out_part, S*R]``. A step's delta is then a few small matmuls over all its tokens:
``x @ A_all.T`` gives every adapter's down-projection of every token, a mask keeps each
token's own adapter's block (zeros elsewhere: a base-model token gets an exact zero), and
each part's ``@ B.T`` projects it back (per part, so no block of zeros is read). That is
for the decode rows; a prefill chunk, one sequence's tokens and so one adapter's, takes
that adapter's slices alone (its many tokens would otherwise pay for every adapter's
product). No loop over rows, and it works the same over quantized base weights (the
delta never touches them). The idea is
S-LoRA's and Punica's (gather by adapter index); with the few adapters a CPU serves at
once, masking the stacked product is simpler than a gather.

Adapters come from PEFT folders (``adapter_config.json`` + ``adapter_model.safetensors``):
plain LoRA on the attention and MLP projections. What this does not compute exactly is
refused at load with the reason: DoRA, per-module rank or alpha patterns, ``bias``
training, extra trained modules (``modules_to_save``: embeddings, LM head), or a target
outside the projections.

Owner: a bank is built off the engine thread (``backends.hf.adapters.pool.AdapterPool``) and
read-only afterwards; the engine thread swaps the runner onto a new one between steps.
``LoraStep`` is one step's, on the engine thread.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backends.hf.model.linears import Linear, make_linear

_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter this engine cannot serve exactly (the message says why)."""


@dataclass(frozen=True, slots=True)
class AdapterWeights:
    """One PEFT LoRA adapter: per ``(layer, module path)`` its ``A`` and ``B``."""

    name: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def read_adapter(name: str, folder: Path) -> AdapterWeights:
    """Read a PEFT LoRA folder; raises ``AdapterError`` for what is not plain LoRA."""
    config_path = folder / "adapter_config.json"
    weights_path = folder / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise AdapterError(
            f"adapter {name!r}: {folder} has no adapter_config.json and "
            "adapter_model.safetensors (a PEFT LoRA folder)"
        )
    config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
    _check_config(name, config)
    rank = int(config["r"])
    alpha = float(config.get("lora_alpha") or rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    from safetensors.torch import load_file

    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(weights_path)).items():
        match = _KEY.search(key)
        if match is None:
            raise AdapterError(f"adapter {name!r}: weight {key!r} is not a LoRA projection")
        layer, module, side = int(match[1]), match[2], match[3]
        found.setdefault((layer, module), {})[side] = tensor
    weights = {}
    for where, sides in found.items():
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"adapter {name!r}: {where} has only lora_{''.join(sides)}")
        weights[where] = (sides["A"], sides["B"])
    return AdapterWeights(name, rank, scaling, weights)


def _check_config(name: str, config: dict[str, Any]) -> None:
    problems = []
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r}")
    if config.get("use_dora"):
        problems.append("DoRA")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        problems.append("per-module rank or alpha patterns")
    if config.get("bias", "none") != "none":
        problems.append(f"bias {config.get('bias')!r}")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save {config.get('modules_to_save')!r}")
    if config.get("fan_in_fan_out"):
        problems.append("fan_in_fan_out")
    if problems:
        raise AdapterError(f"adapter {name!r}: not served: {', '.join(problems)}")


def projection_parts(layer: Any) -> dict[str, list[tuple[str, int]]]:
    """Per fused projection of a decoder layer, the module paths it joins (PEFT's names
    for them) and each one's output rows, in the fused matrix's order."""
    attn, mlp = layer.self_attn, layer.mlp
    qkv = (
        ["self_attn.qkv_proj"]
        if hasattr(attn, "qkv_proj")
        else [f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    )
    gate_up = (
        ["mlp.gate_up_proj"]
        if hasattr(mlp, "gate_up_proj")
        else [f"mlp.{p}" for p in ("gate_proj", "up_proj")]
    )
    paths = {"qkv": qkv, "o": ["self_attn.o_proj"], "gate_up": gate_up, "down": ["mlp.down_proj"]}
    return {
        part: [(path, int(_weight(layer, path).shape[0])) for path in modules]
        for part, modules in paths.items()
    }


def _weight(layer: Any, path: str) -> torch.Tensor:
    """The weight of the module at ``path`` (``self_attn.q_proj``) of ``layer``."""
    module = layer
    for name in path.split("."):
        module = getattr(module, name)
    return module.weight  # type: ignore[no-any-return]


class LoraBank:
    """The resident adapters' stacked ``A`` and ``B`` per layer and fused projection.
    Slot ``s`` holds ``slots[s]`` (None: empty, all zeros). ``keys[s]`` names that slot's
    load, unique for the engine's life: the prefix cache keys on it, so a slot that
    another adapter takes later never reuses the KV the old one computed."""

    def __init__(
        self,
        layers: list[Any],
        slots: Sequence[AdapterWeights | None],
        *,
        dtype: torch.dtype,
        device: torch.device,
        keys: Sequence[int] | None = None,
    ) -> None:
        present = [a for a in slots if a is not None]
        if not present:
            raise AdapterError("a LoRA bank needs at least one adapter")
        self.names = tuple(a.name for a in present)
        self.keys = tuple(keys) if keys is not None else tuple(range(len(slots)))
        self.slot_of = {a.name: s for s, a in enumerate(slots) if a is not None}
        self.dtype, self.device = dtype, device
        self.slots = len(slots)
        self.rank = max(a.rank for a in present)
        self._check_targets(layers, present)
        self.weights: list[dict[str, _Stacks]] = []
        for index, layer in enumerate(layers):
            stacked = {}
            for part, subs in projection_parts(layer).items():
                width = int(_weight(layer, subs[0][0]).shape[1])  # the parts share the input
                a_all, b_parts = self._stack(index, subs, width, slots)
                stacked[part] = _Stacks.of(
                    a_all.to(device, dtype), [b.to(device, dtype) for b in b_parts], self.rank
                )
            self.weights.append(stacked)

    def place(self, name: str) -> tuple[int, int]:
        """Adapter ``name``'s slot and its load's key (``KeyError``: not resident)."""
        slot = self.slot_of[name]
        return slot, self.keys[slot]

    def _check_targets(self, layers: list[Any], adapters: list[AdapterWeights]) -> None:
        known = {module for subs in projection_parts(layers[0]).values() for module, _ in subs}
        for adapter in adapters:
            stray = sorted({m for (i, m) in adapter.weights if m not in known or i >= len(layers)})
            if stray:
                raise AdapterError(
                    f"adapter {adapter.name!r}: targets {', '.join(stray)}, not a projection "
                    f"of this model's layers ({', '.join(sorted(known))})"
                )

    def _stack(
        self,
        layer: int,
        subs: list[tuple[str, int]],
        width: int,
        adapters: Sequence[AdapterWeights | None],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``A`` of every (part, adapter) as rows ``(j*S + s)*R ...`` of one matrix, and
        per part ``j`` its ``[rows_j, S*R]`` of scaled ``B`` (zeros where an adapter does
        not target the part, or beyond its rank)."""
        slots, r = self.slots, self.rank
        a_all = torch.zeros(len(subs) * slots * r, width, dtype=torch.float32)
        b_parts = [torch.zeros(rows, slots * r, dtype=torch.float32) for _, rows in subs]
        for s, adapter in enumerate(adapters):
            if adapter is None:
                continue
            for j, (module, rows) in enumerate(subs):
                pair = adapter.weights.get((layer, module))
                if pair is None:
                    continue
                a, b = pair
                expected = ((adapter.rank, width), (rows, adapter.rank))
                if (tuple(a.shape), tuple(b.shape)) != expected:
                    raise AdapterError(
                        f"adapter {adapter.name!r}: {module} of layer {layer} has shapes "
                        f"{tuple(a.shape)} / {tuple(b.shape)}, not this model's"
                    )
                row = (j * slots + s) * r
                a_all[row : row + adapter.rank] = a.float()
                b_parts[j][:, s * r : s * r + adapter.rank] = b.float() * adapter.scaling
        return a_all, b_parts

    def step(self, decode_slots: list[int], chunks: list[tuple[int, int]]) -> LoraStep | None:
        """One step's plan: each decode row's adapter slot (-1: the base model), then each
        prefill chunk's ``(tokens, slot)`` in packing order; None when no token has an
        adapter."""
        if max(decode_slots, default=-1) < 0 and all(slot < 0 for _, slot in chunks):
            return None
        return LoraStep(self, decode_slots, chunks)


def bank_bytes(layers: list[Any], slots: int, rank: int, dtype: torch.dtype) -> int:
    """The most a bank of ``slots`` adapters of rank ``rank`` holds (the registry's memory
    budget counts this, not what happens to be resident): per fused projection every
    slot's ``A`` and ``B``, twice (the stacks and each slot's own copies)."""
    size = torch.empty((), dtype=dtype).element_size()
    total = 0
    for layer in layers:
        for subs in projection_parts(layer).values():
            width = int(_weight(layer, subs[0][0]).shape[1])
            total += (len(subs) * width + sum(rows for _, rows in subs)) * slots * rank
    return 2 * total * size


class LoraStep:
    """One packed step's adapters. Decode rows (one token per sequence, of any adapters)
    take the stacked product under a mask: per row, ones over its adapter's ``R`` columns
    of every ``S*R`` block. A prefill chunk is one sequence's run of tokens, all of one
    adapter: it takes that adapter's own ``A`` and ``B`` (slices of the stacks), so its
    many tokens do not pay for every adapter's product."""

    def __init__(
        self, bank: LoraBank, decode_slots: list[int], chunks: list[tuple[int, int]]
    ) -> None:
        self._bank = bank
        self._decode = len(decode_slots)
        self._mask: torch.Tensor | None = None
        if max(decode_slots, default=-1) >= 0:
            dtype, device = bank.dtype, bank.device
            rows = torch.tensor(decode_slots, dtype=torch.long, device=device)
            owned = torch.nn.functional.one_hot(rows + 1, bank.slots + 1)[:, 1:]
            self._mask = owned.to(dtype).repeat_interleave(bank.rank, dim=1)
        self._segments: list[tuple[int, int, int]] = []
        start = self._decode
        for length, slot in chunks:
            if slot >= 0:
                self._segments.append((start, start + length, slot))
            start += length

    def add(self, layer: int, part: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add the adapters' share of projection ``part`` of ``layer`` (input ``x``) into
        its output ``y``, in place."""
        stacks = self._bank.weights[layer][part]
        if self._mask is not None:
            d = self._decode
            down = stacks.a_all(x[:d])
            if len(stacks.b_all) == 1:
                y[:d] += stacks.b_all[0](down * self._mask)
            else:
                blocks = down.view(d, len(stacks.b_all), -1) * self._mask[:, None, :]
                y[:d] += torch.cat([b(blocks[:, j]) for j, b in enumerate(stacks.b_all)], dim=-1)
        for start, end, slot in self._segments:
            xs, offset = x[start:end], 0
            for a, b, rows in stacks.per_slot[slot]:
                y[start:end, offset : offset + rows] += b(a(xs))
                offset += rows


@dataclass(frozen=True, slots=True)
class _Stacks:
    """One fused projection's adapters as projections (prepacked like the base weights:
    a bf16 matmul on a transposed view takes a generic path several times slower):
    ``a_all`` every adapter's ``A`` for every part, ``b_all`` per part every adapter's
    ``B``, and ``per_slot[s]`` adapter ``s``'s own ``(A, B, output rows)`` per part."""

    a_all: Linear
    b_all: tuple[Linear, ...]
    per_slot: tuple[tuple[tuple[Linear, Linear, int], ...], ...]

    @classmethod
    def of(cls, a_all: torch.Tensor, b_parts: list[torch.Tensor], rank: int) -> _Stacks:
        slots = b_parts[0].shape[1] // rank
        per_slot = []
        for s in range(slots):
            parts = []
            for j, b in enumerate(b_parts):
                row = (j * slots + s) * rank
                a = make_linear(a_all[row : row + rank].contiguous(), None, "none")
                own_b = b[:, s * rank : (s + 1) * rank].contiguous()
                parts.append((a, make_linear(own_b, None, "none"), int(b.shape[0])))
            per_slot.append(tuple(parts))
        return cls(
            make_linear(a_all, None, "none"),
            tuple(make_linear(b, None, "none") for b in b_parts),
            tuple(per_slot),
        )
