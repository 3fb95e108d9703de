"""Build the backend for one configured model. Imports each implementation lazily, so
a gateway that serves only proxies never imports torch, and one without Triton models
never imports tritonclient."""

from __future__ import annotations

from collections.abc import Callable

from backends.base import Backend
from backends.metrics import BackendMetrics
from config.schema import HFModelConfig, ModelConfig, OpenAIModelConfig, TritonModelConfig

CrashHandler = Callable[[str], None]
"""Called on the event loop when a backend dies on its own (worker killed, engine thread
crashed), with a reason. The registry uses it to mark the model failed and restart it."""


def create_backend(
    config: ModelConfig, metrics: BackendMetrics, on_crash: CrashHandler | None = None
) -> Backend:
    if isinstance(config, HFModelConfig):
        if config.task == "embed":
            from backends.hf.embedding import HFEmbeddingBackend

            return HFEmbeddingBackend(config)
        if config.isolation == "process":
            from backends.process.backend import ProcessBackend

            return ProcessBackend(config, metrics, on_crash=on_crash)
        from backends.hf.backend import HFBackend

        return HFBackend(config, metrics.observer(config.name), on_crash=on_crash)
    if isinstance(config, OpenAIModelConfig):
        from backends.openai_proxy.backend import OpenAIProxyBackend

        return OpenAIProxyBackend(config, metrics)
    if isinstance(config, TritonModelConfig):
        from backends.triton.backend import TritonBackend

        return TritonBackend(config, metrics)
    raise TypeError(f"no backend for {type(config).__name__}")
