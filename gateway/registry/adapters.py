"""LoRA adapters registered at run time: the model config with one more (or one fewer).

An adapter registered through the admin API becomes part of its base model's config in
the registry's table (not the file), so a reload after a crash or an idle unload serves
it again; a hot reload that changes the base model's entry, and a restart, start from
the file. Pure functions; the registry owns the table.
"""

from __future__ import annotations

from backends.base import AdapterSpec
from backends.errors import InvalidRequest, ModelNotFound
from config.schema import (
    AdapterConfig,
    HFModelConfig,
    ModelConfig,
    OpenAIModelConfig,
    UpstreamAdapterConfig,
)


def with_adapter(config: ModelConfig, adapter: AdapterSpec) -> ModelConfig:
    """``config`` with ``adapter`` appended to its ``adapters``."""
    if isinstance(config, HFModelConfig):
        if adapter.source is None:
            raise InvalidRequest(f"adapter {adapter.name!r} needs a source", param="source")
        entry: AdapterConfig | UpstreamAdapterConfig = AdapterConfig(
            name=adapter.name, source=adapter.source, aliases=adapter.aliases
        )
        return config.model_copy(update={"adapters": (*config.adapters, entry)})
    if isinstance(config, OpenAIModelConfig):
        entry = UpstreamAdapterConfig(
            name=adapter.name, source=adapter.source, aliases=adapter.aliases
        )
        return config.model_copy(update={"adapters": (*config.adapters, entry)})
    raise InvalidRequest(
        f"model {config.name!r} (backend {config.backend}) serves no LoRA adapters",
        param="model",
    )


def without_adapter(config: ModelConfig, name: str) -> ModelConfig:
    """``config`` without adapter ``name``; ``ModelNotFound`` when it has none such."""
    adapters = getattr(config, "adapters", ())
    kept = tuple(a for a in adapters if a.name != name)
    if len(kept) == len(adapters):
        raise ModelNotFound(f"model {config.name!r} has no adapter {name!r}", param="model")
    return config.model_copy(update={"adapters": kept})
