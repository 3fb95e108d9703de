"""Kept so imports from before the move still work: memory estimates are the backend's
(``backends.factory.memory_estimate``; the hf weights estimate is ``backends.hf.memory``)."""

from __future__ import annotations

from config.schema import HFModelConfig, ModelConfig


def estimate_memory_bytes(config: ModelConfig) -> int:
    """Configured ``memory_bytes``, else the hf weights' size, else 0 (blocking I/O)."""
    if config.memory_bytes is not None:
        return config.memory_bytes
    if not isinstance(config, HFModelConfig):
        return 0
    from backends.hf.memory import estimate_memory_bytes as hf_estimate

    return hf_estimate(config)


__all__ = ["estimate_memory_bytes"]
