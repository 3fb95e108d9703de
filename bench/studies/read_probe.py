"""The memory read limit of a decode step, and what one step reads.

A decode step at small batch reads every weight once and the KV of every running
sequence; it computes little. Its floor is therefore bytes read ÷ read bandwidth. The
probe measures that bandwidth the way an engine sees it: torch (the same thread pool and
kernels), a float32 sum over a buffer several times larger than any last-level cache, so
every byte comes from DRAM. Best of a few repetitions after one warm-up.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from backends.hf.loading.memory_estimate import kv_bytes_per_token, tensor_bytes

_EMBED_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight")


@dataclass(frozen=True, slots=True)
class ReadProbe:
    gb_per_s: float
    threads: int
    mib: int


def probe_read_bandwidth(
    threads: int | None = None, mib: int = 1024, repeats: int = 5
) -> ReadProbe:
    """Best read bandwidth of a torch sum over ``mib`` MiB on ``threads`` threads (default:
    the CPUs this process may use). The thread count is restored afterwards."""
    import torch

    count = threads or len(os.sched_getaffinity(0))
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        buffer = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
        buffer.sum()  # faults the pages in and warms the pool
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            buffer.sum()
            best = min(best, time.perf_counter() - start)
        return ReadProbe(gb_per_s=buffer.numel() * 4 / best / 1e9, threads=count, mib=mib)
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True, slots=True)
class StepBytes:
    weights: int
    kv: int

    @property
    def total(self) -> int:
        return self.weights + self.kv


def decode_step_bytes(folder: Path, dtype: str, *, context_tokens: float) -> StepBytes:
    """Bytes one single-sequence decode step reads in ``folder``'s model at ``dtype``:
    all weights, except that an untied embedding table is only gathered (one row), plus
    K and V of every layer for ``context_tokens`` positions."""
    sizes = tensor_bytes(folder, dtype)
    weights = sum(sizes.values())
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if not config.get("tie_word_embeddings", True):
        embed = sum(sizes.get(name, 0) for name in _EMBED_NAMES)
        weights -= embed - embed // int(config["vocab_size"])
    kv = int(kv_bytes_per_token(folder, dtype) * context_tokens)
    return StepBytes(weights=weights, kv=kv)
