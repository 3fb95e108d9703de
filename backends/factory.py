"""Build the backend for one configured model. Imports each implementation lazily, so
a gateway that serves only proxies never imports torch, and one without Triton models
never imports tritonclient."""

from __future__ import annotations

from backends.base import Backend
from backends.metrics import BackendMetrics
from config.schema import HFModelConfig, ModelConfig, OpenAIModelConfig, TritonModelConfig


def create_backend(config: ModelConfig, metrics: BackendMetrics) -> Backend:
    if isinstance(config, HFModelConfig):
        if config.isolation == "process":
            from backends.process.backend import ProcessBackend

            return ProcessBackend(config, metrics)
        from backends.hf.backend import HFBackend

        return HFBackend(config, metrics.observer(config.name))
    if isinstance(config, OpenAIModelConfig):
        from backends.openai_proxy.backend import OpenAIProxyBackend

        return OpenAIProxyBackend(config, metrics)
    if isinstance(config, TritonModelConfig):
        from backends.triton.backend import TritonBackend

        return TritonBackend(config, metrics)
    raise TypeError(f"no backend for {type(config).__name__}")
