"""Automatic prefix caching for the slot KV cache: reuse the keys of a shared prompt prefix.

A prompt is cut into blocks of ``block_size`` tokens from position 0. A block is known by
its parent block and its own token ids, so a block matches only when the *whole* prefix
up to its end matches (the chained key vLLM also uses). The dict compares the actual
token tuples, so two prefixes can never be confused by a hash collision.

Storage is a pool ``[layers, blocks, kv_heads, block_size, head_dim]`` for K and V, on
the runner's device, grown geometrically up to ``max_tokens`` (the KV budget). Because
running sequences live in slots (``kv_cache.py``), a hit *copies* the cached blocks into
the new sequence's slot: a memory copy of ``matched`` positions instead of a forward
pass over them, which is the cost that matters (on CPU a 1,000-token prefill of
SmolLM2 is ~1 s of matmuls; the copy is ~23 MB of memcpy in bf16). Nothing in the pool is
ever written while it is shared: entries are immutable once stored.

Eviction is LRU over *leaf* blocks (blocks no other cached block extends), so a cached
chain is always reachable from its root; a lookup or insert refreshes every block it
touches.

At least the last prompt token is always computed: the engine needs its logits.

Owner: the engine thread (through the scheduler); nothing here is thread-safe.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from backends.hf.model.kv_cache import SlotKVCache

BLOCK_SIZE = 16


def _root(adapter: int, fixed: bool) -> int:
    """The parent of a prompt's first block (-1: the base model's, in calls as rows
    alone). A LoRA adapter's prompts, and prompts prefilled in fixed-size calls
    (``PrefillChunk.fixed``), hang off roots of their own: the same tokens give other
    keys and values under another adapter, and round otherwise in the other calls.
    ``adapter``: the adapter load's key (-1: none; see ``LoraBank.keys``)."""
    return -1 - 2 * (max(adapter, -1) + 1) - int(fixed)


@dataclass(eq=False, slots=True)
class _Block:
    index: int  # row in the pool
    key: tuple[int, tuple[int, ...]]  # (parent block index or a root, token ids)
    children: int = 0


@dataclass(slots=True)
class PrefixStats:
    """Prompt tokens looked up and found, since the cache was built."""

    queried: int = 0
    hit: int = 0
    evicted_blocks: int = 0


class PrefixCache:
    """See the module docstring. ``cache`` is the slot cache blocks are copied from/into."""

    def __init__(
        self,
        cache: SlotKVCache,
        *,
        max_tokens: int,
        block_size: int = BLOCK_SIZE,
        initial_blocks: int = 16,
    ) -> None:
        if block_size <= 0 or max_tokens < block_size:
            raise ValueError("the prefix cache must hold at least one block")
        self._cache = cache
        self.block_size = block_size
        self.max_blocks = max_tokens // block_size
        self._blocks: dict[tuple[int, tuple[int, ...]], _Block] = {}
        self._by_index: dict[int, _Block] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # leaf and inner blocks, by use
        self._free: list[int] = []
        self._capacity = 0
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._initial = min(initial_blocks, self.max_blocks)
        self.stats = PrefixStats()

    # ------------------------------------------------------------------ public

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    @property
    def max_nbytes(self) -> int:
        """What the pool holds once grown to its budget (what a memory budget must see)."""
        return self.max_blocks * self.block_size * self._cache.bytes_per_token

    @property
    def nbytes(self) -> int:
        if self._k is None:
            return 0
        return 2 * self._k.numel() * self._k.element_size()

    def restore(
        self, prompt_ids: list[int], slot: int, adapter: int = -1, *, fixed: bool = False
    ) -> int:
        """Copy the longest cached prefix of ``prompt_ids`` into ``slot``; returns how many
        positions (a multiple of ``block_size``, fewer than ``len(prompt_ids)``) are
        now in the slot and need no prefill."""
        chain = self._match(prompt_ids, limit=len(prompt_ids) - 1, root=_root(adapter, fixed))
        self.stats.queried += len(prompt_ids)
        if not chain:
            return 0
        matched = len(chain) * self.block_size
        self.stats.hit += matched
        self._cache.ensure(slot + 1, matched)
        rows = torch.tensor([b.index for b in chain], dtype=torch.long, device=self._cache.device)
        for pool, dest in ((self._k, self._cache.k), (self._v, self._cache.v)):
            assert pool is not None
            # [L, n, H, B, D] -> [L, H, n*B, D], the slot's layout
            blocks = pool.index_select(1, rows).transpose(1, 2)
            dest[:, slot, :, :matched] = blocks.reshape(
                dest.shape[0], dest.shape[2], matched, dest.shape[4]
            )
        self._touch(chain)
        return matched

    def insert(
        self, prompt_ids: list[int], slot: int, adapter: int = -1, *, fixed: bool = False
    ) -> None:
        """Store every full block of ``prompt_ids`` not cached yet; ``slot`` holds the
        prompt's keys at positions ``0..len-1``."""
        bs = self.block_size
        total = len(prompt_ids) // bs
        root = _root(adapter, fixed)
        chain = self._match(prompt_ids, limit=len(prompt_ids), root=root)
        parent = chain[-1].index if chain else root
        new: list[_Block] = []
        for number in range(len(chain), total):
            index = self._allocate(protect={b.index for b in (*chain, *new)})
            if index is None:
                break
            key = (parent, tuple(prompt_ids[number * bs : (number + 1) * bs]))
            block = _Block(index=index, key=key)
            self._blocks[key] = block
            self._by_index[index] = block
            if parent >= 0:
                self._by_index[parent].children += 1
            new.append(block)
            parent = index
        if new:
            self._copy_in(slot, len(chain), new)
        self._touch([*chain, *new])

    # ------------------------------------------------------------------ internals

    def _match(self, prompt_ids: list[int], *, limit: int, root: int) -> list[_Block]:
        bs = self.block_size
        chain: list[_Block] = []
        parent = root
        for number in range(limit // bs):
            block = self._blocks.get((parent, tuple(prompt_ids[number * bs : (number + 1) * bs])))
            if block is None:
                break
            chain.append(block)
            parent = block.index
        return chain

    def _touch(self, chain: list[_Block]) -> None:
        # Root first, so a chain's leaf is its most recent block (leaves go first).
        for block in chain:
            self._lru[block.index] = None
            self._lru.move_to_end(block.index)

    def _allocate(self, *, protect: set[int]) -> int | None:
        if self._free:
            return self._free.pop()
        if self._capacity < self.max_blocks:
            self._grow()
            return self._free.pop()
        return self._evict_one(protect)

    def _evict_one(self, protect: set[int]) -> int | None:
        for index in self._lru:  # oldest first
            block = self._by_index[index]
            if block.children == 0 and index not in protect:
                del self._lru[index]
                del self._blocks[block.key]
                del self._by_index[index]
                parent = block.key[0]
                if parent >= 0:
                    self._by_index[parent].children -= 1
                self.stats.evicted_blocks += 1
                return index
        return None

    def _grow(self) -> None:
        old = self._capacity
        new = min(self.max_blocks, max(self._initial, 2 * old))
        cache = self._cache
        shape = (cache.layers, new, cache.kv_heads, self.block_size, cache.head_dim)
        for name in ("_k", "_v"):
            tensor = torch.empty(shape, dtype=cache.dtype, device=cache.device)
            previous: torch.Tensor | None = getattr(self, name)
            if previous is not None:
                tensor[:, :old] = previous
            setattr(self, name, tensor)
        self._free.extend(range(new - 1, old - 1, -1))
        self._capacity = new

    def _copy_in(self, slot: int, first: int, blocks: list[_Block]) -> None:
        """Copy consecutive blocks ``first..first+len-1`` of ``slot`` into the pool."""
        bs = self.block_size
        begin, end = first * bs, (first + len(blocks)) * bs
        rows = torch.tensor([b.index for b in blocks], dtype=torch.long, device=self._cache.device)
        for pool, src in ((self._k, self._cache.k), (self._v, self._cache.v)):
            assert pool is not None
            region = src[:, slot, :, begin:end]  # [L, H, n*B, D]
            shaped = region.reshape(src.shape[0], src.shape[2], len(blocks), bs, src.shape[4])
            pool.index_copy_(1, rows, shaped.transpose(1, 2))
