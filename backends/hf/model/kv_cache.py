"""The slot KV cache: one preallocated tensor per K and V, one slot per live sequence.

Layout: ``[layers, slots, kv_heads, capacity, head_dim]``. A sequence owns one slot and
its keys sit at positions ``0..length-1`` of that slot. Why this layout (measured against
a per-sequence ``DynamicCache`` and against gathering slots per step):

- joining costs nothing for the others: a new sequence writes only its own slot;
- leaving costs one copy of one sequence: the engine keeps decoding sequences in slots
  ``0..D-1`` (``move`` fills a hole with the last one), so the decode attention reads a
  plain strided *view* ``[:D, :, :L]`` of the cache, with no per-step gather or concat;
- new keys land with one ``index_copy_`` per layer through a flat index computed once
  per step for all layers;
- the tensor only grows (more slots, more capacity) when a sequence needs it, and never
  per step.

Owner: the engine thread (via the runner); nothing here is thread-safe.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


class SlotKVCache:
    """Preallocated keys and values for ``slots`` sequences of up to ``capacity`` tokens."""

    def __init__(
        self,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        max_slots: int,
        max_capacity: int,
        dtype: torch.dtype,
        device: torch.device,
        initial_slots: int = 4,
        initial_capacity: int = 256,
    ) -> None:
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.max_slots = max_slots
        self.max_capacity = max_capacity
        self.dtype = dtype
        self.device = device
        self.slots = min(initial_slots, max_slots)
        self.capacity = min(initial_capacity, max_capacity)
        self.k = self._alloc(self.slots, self.capacity)
        self.v = self._alloc(self.slots, self.capacity)

    @property
    def bytes_per_token(self) -> int:
        """K and V of one position in every layer: layers x 2 x kv_heads x head_dim x
        the element size (the layout's real cost; vLLM's paged blocks cost the same)."""
        element = torch.empty((), dtype=self.dtype).element_size()
        return self.layers * 2 * self.kv_heads * self.head_dim * element

    @property
    def nbytes(self) -> int:
        """What the two tensors hold now (slots x capacity positions)."""
        return 2 * self.k.numel() * self.k.element_size()

    def _alloc(self, slots: int, capacity: int) -> torch.Tensor:
        shape = (self.layers, slots, self.kv_heads, capacity, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _grown(self, old: torch.Tensor, slots: int, capacity: int) -> torch.Tensor:
        """A larger tensor holding ``old``; only the new region is zeroed (the decode
        attention reads stale positions under a -inf mask, which garbage NaNs would
        poison), so a growth writes each byte once instead of twice."""
        shape = (self.layers, slots, self.kv_heads, capacity, self.head_dim)
        new = torch.empty(shape, dtype=self.dtype, device=self.device)
        new[:, : self.slots, :, : self.capacity] = old
        new[:, : self.slots, :, self.capacity :].zero_()
        new[:, self.slots :].zero_()
        return new

    def ensure(self, slots: int, capacity: int) -> None:
        """Grow (geometrically, keeping contents) so that ``slots`` x ``capacity`` fit."""
        if slots <= self.slots and capacity <= self.capacity:
            return
        if slots > self.max_slots or capacity > self.max_capacity:
            raise ValueError(f"cache request {slots}x{capacity} beyond its limits")
        new_slots = max(self.slots, min(self.max_slots, max(slots, 2 * self.slots)))
        new_cap = self.capacity
        if capacity > self.capacity:
            new_cap = min(self.max_capacity, max(capacity, 2 * self.capacity))
        for name in ("k", "v"):
            setattr(self, name, self._grown(getattr(self, name), new_slots, new_cap))
        self.slots, self.capacity = new_slots, new_cap
        log.info(
            "kv cache grown to %d slots x %d positions: %.1f MiB (%d bytes per token)",
            new_slots,
            new_cap,
            self.nbytes / 2**20,
            self.bytes_per_token,
        )

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first ``length`` positions of slot ``src`` into slot ``dst``."""
        if src == dst or length == 0:
            return
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    def write_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Row indices into a layer's ``[slots*kv_heads*capacity, head_dim]`` view for
        tokens at (slot, position), ordered token-major then kv head."""
        heads = torch.arange(self.kv_heads, device=slots.device)
        base = (slots[:, None] * self.kv_heads + heads[None, :]) * self.capacity
        return (base + positions[:, None]).reshape(-1)
