"""Build the backend for one configured model, and estimate its memory before loading.
Imports each implementation lazily, so a gateway that serves only proxies never imports
torch, and one without Triton models never imports tritonclient."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

from backends.base import Backend
from backends.hop_metrics import BackendMetrics, WorkerObserver
from config.schema import HFModelConfig, ModelConfig, OpenAIModelConfig, TritonModelConfig

CrashHandler = Callable[[str], None]
"""Called on the event loop when a backend dies on its own (worker killed, engine thread
crashed), with a reason. The registry uses it to mark the model failed and restart it."""


class BackendFactory(Protocol):
    """What the registry calls to build a model's backend (``create_backend`` with the
    metrics bound, or a test's fake)."""

    def __call__(self, config: ModelConfig, on_crash: CrashHandler, /) -> Backend: ...


MemoryEstimate = Callable[[ModelConfig], Awaitable["int | None"]]
"""Bytes a model will hold once loaded, or None when its backend cannot tell."""


async def memory_estimate(config: ModelConfig) -> int | None:
    """Configured ``memory_bytes``, else the backend's own estimate: the weights for an
    ``hf`` model (read from file headers in a thread), None for proxies and Triton,
    which hold no weights here."""
    if config.memory_bytes is not None:
        return config.memory_bytes
    if isinstance(config, HFModelConfig):
        from backends.hf.loading.memory_estimate import estimate_memory_bytes

        return await asyncio.to_thread(estimate_memory_bytes, config)
    return None


def in_process_hf(
    config: HFModelConfig, observer: WorkerObserver, on_crash: CrashHandler | None = None
) -> Backend:
    """The in-process engine of an ``hf`` model: the pooling backend for ``task: embed``,
    the cross-encoder for ``task: score``, else the generation engine. Also what a process
    worker builds (its default factory)."""
    if config.task == "embed":
        from backends.hf.embedding.backend import HFEmbeddingBackend

        return HFEmbeddingBackend(config)
    if config.task == "score":
        from backends.hf.embedding.cross_encoder import HFCrossEncoderBackend

        return HFCrossEncoderBackend(config)
    from backends.hf.backend import HFBackend

    return HFBackend(config, observer, on_crash=on_crash)


def create_backend(
    config: ModelConfig, metrics: BackendMetrics, on_crash: CrashHandler | None = None
) -> Backend:
    if isinstance(config, HFModelConfig):
        if config.isolation == "process":
            from backends.process.backend import ProcessBackend

            return ProcessBackend(config, metrics, on_crash=on_crash)
        return in_process_hf(config, metrics.observer(config.name), on_crash)
    if isinstance(config, OpenAIModelConfig):
        from backends.openai_proxy.backend import OpenAIProxyBackend

        return OpenAIProxyBackend(config, metrics)
    if isinstance(config, TritonModelConfig):
        from backends.triton.backend import TritonBackend

        return TritonBackend(config, metrics)
    raise TypeError(f"no backend for {type(config).__name__}")
