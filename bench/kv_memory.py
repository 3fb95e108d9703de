"""KV-cache memory per token of both engines, for the models and prefix suites' notes.

Both engines keep K and V of every layer for each cached position, so the bytes per
token follow from the model's ``config.json``: layers x 2 x kv_heads x head_dim x element
bytes (llmso: ``SlotKVCache.bytes_per_token``, the same formula over its real layout;
vLLM-CPU: its paged blocks of the same shape). What each one *holds* differs: vLLM
preallocates ``VLLM_CPU_KVCACHE_SPACE`` GiB at start; llmso grows its slot cache with the
load (at most ``(max_num_seqs + 1) x max_context`` positions) plus the prefix pool up to
``prefix_cache_tokens``.
"""

from __future__ import annotations

from pathlib import Path

from backends.hf.loading.memory_estimate import kv_bytes_per_token

_GIB = 1024**3


def kv_notes(
    model_path: str, dtype: str, *, vllm_space_gib: int, prefix_tokens: int | None
) -> tuple[str, ...]:
    """One or two note lines; empty when the model folder has no usable config."""
    per_token = kv_bytes_per_token(Path(model_path), dtype)
    if not per_token:
        return ()
    vllm_tokens = vllm_space_gib * _GIB // per_token
    lines = [
        f"KV cache per token (from config.json, both engines): {per_token:,} bytes "
        f"({per_token / 1024:.1f} KiB); vLLM-CPU preallocates {vllm_space_gib} GiB = "
        f"{vllm_tokens:,} tokens; llmso's slot cache grows with the load",
    ]
    if prefix_tokens:
        pool = prefix_tokens * per_token
        lines.append(
            f"llmso prefix pool: up to {prefix_tokens:,} tokens = {pool / 2**20:.0f} MiB "
            "(counted in the model's memory_bytes)"
        )
    return tuple(lines)
