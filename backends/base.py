"""The backend contract: what the gateway hands a backend, and what it gets back.

Everything here is plain data (frozen, slotted dataclasses) or a Protocol. The gateway
translates wire types into a ``GenerationRequest`` once; a backend turns it into an
async stream of ``BackendEvent`` values and raises ``BackendError`` subclasses when it
cannot (``backends.errors``). Backends never see HTTP, and the gateway never sees tensors.

Event order for one request: zero or one ``Started``; zero or one ``PromptLogprobs``
(only when asked); then per choice index any number of ``ReasoningDelta`` (the thought),
``TextDelta`` and ``ToolCallDelta`` (the answer), interleaved in output order, followed by
exactly one ``Finished``; then exactly one ``Usage`` last. A backend splits a reasoning
model's thought from its answer (``backends.reasoning``) before anything reads the
answer: tool calls and JSON come from ``TextDelta`` text only.

JSON values that cross this contract (tool parameter schemas, ``response_format``
schemas, tool-call arguments, raw content parts) travel as JSON *text*: immutable,
hashable (a grammar cache keys on it) and forwarded byte-for-byte by proxies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Protocol, runtime_checkable

# The errors live in one module; they stay importable from the contract's home.
from backends.errors import (
    ApiError,
    BackendCrashed,
    BackendError,
    ContextLengthExceeded,
    InvalidRequest,
    ModelNotFound,
    NotReady,
    Overloaded,
    UnsupportedFeature,
    UpstreamBadResponse,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)

FinishReason = Literal["stop", "length", "tool_calls"]


class RequestKind(Enum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call an assistant made: ``arguments`` is the JSON text the model produced."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ContentPart:
    """One part of a multi-part message, kept as the client sent it (``json`` is the
    part's JSON object text) so a proxy can forward image and other parts untouched."""

    type: str
    json: str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat message.

    ``content`` is the message text ("" for an assistant turn whose content was null).
    An assistant turn may carry ``tool_calls`` and its ``reasoning``; a ``tool`` message
    answers the call
    ``tool_call_id``. ``parts`` is set only when the client sent non-text parts: every
    part in order (``content`` then holds the joined text parts).
    """

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    parts: tuple[ContentPart, ...] = ()
    reasoning: str = ""
    """An earlier assistant turn's thought, handed back by the client: passed to the chat
    template as the message's ``reasoning_content``, which keeps or drops it as the
    model's own template does (Qwen3's drops it)."""


JsonSchema = Mapping[str, Any] | bool
"""A JSON Schema as parsed JSON, checked against its meta-schema at the edge. Read-only:
a backend that needs text dumps it once (into its upstream body, a grammar, a prompt)."""


def _no_parameters() -> JsonSchema:
    return {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the model may call; ``parameters`` is its JSON Schema."""

    name: str
    description: str | None = None
    parameters: JsonSchema = field(default_factory=_no_parameters)
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``none``: never call; ``auto``: the model decides; ``required``: at least one
    call; ``named``: exactly the tool ``name``."""

    mode: Literal["none", "auto", "required", "named"] = "auto"
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """``text``: free text; ``json_object``: any JSON object; ``json_schema``: JSON
    matching ``schema``. A ``json_object`` may carry a ``schema`` too (the convention of
    llama.cpp's server, Together and instructor's ``JSON_SCHEMA`` mode): it is then held
    to that schema like ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema: JsonSchema | None = None
    strict: bool | None = None
    description: str | None = None


TEXT_FORMAT = ResponseFormat()

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


@dataclass(frozen=True, slots=True)
class ReasoningControls:
    """What the client asked of a reasoning model's thought; every field ``None`` (or
    empty) when it asked nothing.

    ``effort``: OpenAI's ``reasoning_effort`` / Responses ``reasoning.effort`` as sent
    (``none`` also sets ``thinking`` off). ``thinking``: the thought switched on or off
    (Messages ``thinking.type``, chat ``chat_template_kwargs.enable_thinking``); a
    template's switch (Qwen3's ``enable_thinking``) is set from it. ``budget_tokens``:
    the most tokens the thought may take (Messages ``thinking.budget_tokens``, vLLM's
    ``thinking_token_budget``); below the request's ``max_tokens``, which counts thought
    and answer together. ``template_kwargs``: the client's ``chat_template_kwargs``, a
    JSON object text ("" when none), for templates and servers that take it.

    Each control needs its ``Feature`` where the model has a reasoning parser
    (``Feature.REASONING``); a model without one ignores them (as vLLM does)."""

    effort: ReasoningEffort | None = None
    thinking: bool | None = None
    budget_tokens: int | None = None
    template_kwargs: str = ""

    @property
    def asked(self) -> bool:
        return (
            self.effort is not None
            or self.thinking is not None
            or self.budget_tokens is not None
            or bool(self.template_kwargs)
        )


NO_REASONING_CONTROLS = ReasoningControls()


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request decoding controls, already validated and clamped by the gateway.

    ``max_tokens`` is ``None`` when the client set no limit (``effective_max_tokens``
    turns that into the limit a backend enforces or forwards). ``temperature == 0``
    means greedy. ``top_k == 0`` means no top-k cut. ``logprobs`` is ``None`` when off,
    else the number of top alternatives (0..20) to return next to each sampled token's
    own log-probability.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    n: int = 1
    logprobs: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def effective_max_tokens(
    requested: int | None, default: int | None, room: int | None
) -> int | None:
    """The completion-token limit a backend enforces or forwards, the one rule for all.

    The client's ``max_tokens`` when it set one; else the model's ``default_max_tokens``
    (config), capped by ``room``; else ``room``, the context left after the prompt
    (``context - prompt tokens``: OpenAI's meaning of no limit). ``room`` is ``None``
    when the backend knows the context or the prompt's length not; with no default
    either, the result is ``None`` and a proxy sends no limit (the upstream's own
    applies)."""
    if requested is not None:
        return requested
    if default is None:
        return room
    return default if room is None else min(default, room)


@dataclass(frozen=True, slots=True)
class Tenant:
    """Whom a request runs for, as a waiting queue shares its slots: the client key's
    name (``""``: no key) and its weight (its share relative to other tenants waiting at
    the same priority; ``backends.fair_queue``)."""

    name: str = ""
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError("a tenant's weight must be positive")


NO_TENANT = Tenant()
"""A request that no client key names (the front door sets the key's own)."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated generation call.

    ``messages`` is set for chat requests, ``prompt`` for completions (or, instead of
    ``prompt``, ``prompt_token_ids``: the prompt already tokenised, fed as is; needs
    ``Feature.PROMPT_TOKEN_IDS``). ``suffix`` is the completions text after the insertion
    point (needs ``Feature.SUFFIX``). Backends that own
    a tokenizer render the chat template themselves; proxies forward messages as they are.
    ``arrival_time`` is ``time.time()`` at the edge.

    Tools and structured output: ``tool_choice`` and ``parallel_tool_calls`` are ``None``
    when the client did not set them (the OpenAI defaults then apply: ``auto`` with tools,
    parallel calls allowed), so a proxy forwards only what was asked. ``logit_bias`` maps
    token-id strings to biases. ``passthrough`` is a JSON object text of wire fields the
    contract does not model, for proxies to forward untouched ("" when none).
    ``trace_headers`` are W3C trace-context headers (``traceparent``, ``tracestate``) that a
    backend calling another server forwards as they are (HTTP headers, gRPC metadata).
    """

    request_id: str
    model: str
    kind: RequestKind
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] = ()
    prompt: str = ""
    arrival_time: float = 0.0
    user: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    suffix: str | None = None
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat = TEXT_FORMAT
    logit_bias: tuple[tuple[str, float], ...] = ()
    passthrough: str = ""
    prompt_logprobs: int | None = None
    """Score the prompt too (needs ``Feature.PROMPT_LOGPROBS``): ``None`` when off, else
    how many top alternatives (0..20) to return next to each prompt token's own
    log-probability; the backend answers with one ``PromptLogprobs`` event."""

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """The choice in force: the client's, else ``auto`` with tools, ``none`` without."""
        if self.tool_choice is not None:
            return self.tool_choice
        return ToolChoice("auto") if self.tools else ToolChoice("none")

    trace_headers: tuple[tuple[str, str], ...] = ()
    priority: int = 0
    """Lower is served first (vLLM's meaning): the client's own ``priority`` within its
    key's range, else the key's level (high -1, normal 0, low 1)."""
    asked_priority: int | None = None
    """The client's own ``priority`` field, ``None`` when it sent none: the front door
    checks it against the key's range and sets ``priority``; backends never read it."""
    tenant: Tenant = NO_TENANT
    session_id: str | None = None
    """The client's ``x-session-id`` header: a key for replica affinity, never sent on."""
    adapter: str | None = None
    """The LoRA adapter (its configured name) the base model answers with; None: the base
    itself. Set by routing when the request names an adapter."""
    reasoning: ReasoningControls = NO_REASONING_CONTROLS
    """The client's reasoning controls (``ReasoningControls``)."""


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """An alternative token; ``token_id`` is ``None`` where the backend does not know it."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    token_id: int | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A token with its log-probability: ``None`` only for an echoed prompt's first
    token, which nothing precedes (OpenAI's legacy ``null``)."""

    token: str
    logprob: float | None
    bytes: tuple[int, ...]
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class PromptToken:
    """One prompt token, scored: ``logprob`` is log P(token | the tokens before it) and
    ``rank`` its 1-based rank in that distribution; both ``None`` for the first token,
    which nothing precedes. ``top``: the most likely tokens at its position, best first
    (empty for the first token)."""

    token_id: int
    token: str
    bytes: tuple[int, ...]
    logprob: float | None
    rank: int | None
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """Every prompt token, scored, in order: asked by ``GenerationRequest.prompt_logprobs``,
    sent once after ``Started`` and before any delta (the prompt is shared by all choices)."""

    tokens: tuple[PromptToken, ...]


@dataclass(frozen=True, slots=True)
class Started:
    """Inference began: the request left the queue. Times are ``time.time()`` values."""

    queued_at: float
    started_at: float


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text for choice ``index``; ``logprobs`` covers the tokens behind ``text``."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    num_tokens: int = 1


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New thought text for choice ``index``: what a reasoning model wrote before its
    answer, never part of it. ``num_tokens`` counts the tokens behind ``text``
    (``Usage.reasoning_tokens`` is their sum)."""

    index: int
    text: str
    num_tokens: int = 1


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of tool call ``call_index`` (0, 1, ... per choice) of choice ``index``.

    The first delta of a call carries its ``id`` (``call_...``) and ``name``; later ones
    carry only ``arguments_fragment``; the fragments joined are the arguments JSON text.
    A choice that made calls finishes with reason ``tool_calls``.
    """

    index: int
    call_index: int
    id: str | None = None
    name: str | None = None
    arguments_fragment: str = ""
    num_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Finished:
    """Choice ``index`` ended. ``closed_by_budget``: the engine completed a constrained
    value with the shortest valid ending it found, because ``max_tokens`` was near
    (the reason is then ``stop`` or ``tool_calls``: the value is whole and valid).
    ``stop_sequence``: the request's stop string that ended it (reason ``stop``), where
    the backend knows which one (hf, vLLM); ``None`` for an end of sequence or unknown."""

    index: int
    reason: FinishReason
    closed_by_budget: bool = False
    stop_sequence: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts, always the last event. ``upstream_seconds`` is the time this request
    spent waiting on an external server (proxies, Triton), so the gateway can report its
    own overhead; ``None`` for in-process backends.

    A stream that broke and resumed on another replica (``resumes`` > 0) bills its
    ``prompt_tokens`` once; the prompt tokens the upstream processed again to continue
    it are the gateway's cost, ``resume_prompt_tokens``, never billed to the client.

    ``reasoning_tokens``: the part of ``completion_tokens`` that was thought.
    ``cached_tokens``: the part of ``prompt_tokens`` read from a prefix cache instead of
    computed (the hf engine's hits, an upstream's ``prompt_tokens_details.cached_tokens``;
    0 where the backend cannot tell), priced at the cached rate."""

    prompt_tokens: int
    completion_tokens: int
    upstream_seconds: float | None = None
    resumes: int = 0
    resume_prompt_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


BackendEvent = (
    Started | PromptLogprobs | ReasoningDelta | TextDelta | ToolCallDelta | Finished | Usage
)


class Feature(Enum):
    """A request feature a backend may or may not honour.

    A backend declares what it serves in ``ModelInfo.features``; the gateway refuses a
    request that needs a feature the routed backend lacks with a 400 naming the request
    field (``gateway.service.capabilities``), so the decision is the backend's, never a guess.
    """

    CHAT = "chat"
    COMPLETION = "completion"
    LOGPROBS = "logprobs"
    TOOLS = "tools"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    IMAGE_INPUT = "image_input"
    OTHER_INPUT = "other_input"  # content parts other than text and image (audio, file)
    LOGIT_BIAS = "logit_bias"
    EMBEDDINGS = "embeddings"
    # Text pairs scored (``/v1/score``, ``/v1/rerank``): ``backends.scoring``.
    SCORE = "score"
    # Text to token ids and back with the model's tokenizer: ``backends.tokenizing``.
    TOKENIZE = "tokenize"
    PROMPT_TOKEN_IDS = "prompt_token_ids"
    SUFFIX = "suffix"
    # The prompt's own tokens scored (``echo`` with ``logprobs``, ``prompt_logprobs``).
    PROMPT_LOGPROBS = "prompt_logprobs"
    # Not a request field: a JSON value or forced tool call always closes within
    # max_tokens (the hf engine's budget-aware decoding); proxies and Triton pass the
    # request on and leave a cut value as the server returns it.
    CLOSES_BY_BUDGET = "closes_by_budget"
    # Not a request field: the model's thought comes as ``ReasoningDelta`` apart from the
    # answer (a reasoning parser is configured, or the upstream splits it). Where it is
    # declared, each reasoning control needs its own feature below (400 naming the
    # control's field otherwise); where not, controls are ignored.
    REASONING = "reasoning"
    REASONING_EFFORT = "reasoning_effort"  # passed on to a template or server that reads it
    THINKING_SWITCH = "thinking_switch"  # the thought switched on or off
    THINKING_BUDGET = "thinking_budget"  # the thought held to budget_tokens


TEXT_GENERATION: frozenset[Feature] = frozenset(
    {Feature.CHAT, Feature.COMPLETION, Feature.LOGPROBS}
)
"""What every generation backend served before tools and structured outputs existed."""


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What ``/v1/models`` and the registry may show about a loaded backend.

    ``features`` is the backend's declaration of what it can honour (see ``Feature``).
    """

    max_context: int | None = None
    memory_bytes: int | None = None
    owned_by: str = "llmso"
    extra: dict[str, str] = field(default_factory=dict)
    features: frozenset[Feature] = TEXT_GENERATION


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """A LoRA adapter registered at run time (``POST /admin/models/{base}/adapters``)."""

    name: str
    source: str | None
    """hf: a PEFT folder or ``package:<dist>``; openai: the upstream's ``lora_path``."""
    aliases: tuple[str, ...] = ()


@runtime_checkable
class AdapterHost(Protocol):
    """A backend whose adapters change while it runs. ``add_adapter`` returns once the
    adapter can serve (hf: read and checked; openai: recorded, loaded on first use) and
    raises ``InvalidRequest`` naming ``source`` when it cannot; ``remove_adapter`` lets
    requests in flight finish on it and raises ``ModelNotFound`` for an unknown name."""

    async def add_adapter(self, adapter: AdapterSpec) -> None: ...

    async def remove_adapter(self, name: str) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """One loaded model behind one backend.

    Lifecycle: ``start()`` once (loads weights or connects), then any number of
    concurrent ``generate()`` calls from the event loop, then ``stop()`` once. ``stop``
    must end every open stream (each raises ``BackendCrashed`` or finishes) and free
    resources. ``generate`` returns an async iterator; closing it early (the client
    left) must cancel the work behind it.
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]: ...

    async def ready(self) -> bool: ...

    def info(self) -> ModelInfo: ...


__all__ = [
    "NO_REASONING_CONTROLS",
    "TEXT_GENERATION",
    "AdapterHost",
    "AdapterSpec",
    "ApiError",
    "Backend",
    "BackendCrashed",
    "BackendError",
    "BackendEvent",
    "ChatMessage",
    "ContextLengthExceeded",
    "Feature",
    "FinishReason",
    "Finished",
    "GenerationRequest",
    "InvalidRequest",
    "ModelInfo",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "PromptLogprobs",
    "PromptToken",
    "ReasoningControls",
    "ReasoningDelta",
    "ReasoningEffort",
    "RequestKind",
    "SamplingParams",
    "Started",
    "TextDelta",
    "TokenLogprob",
    "TopLogprob",
    "UnsupportedFeature",
    "UpstreamBadResponse",
    "UpstreamRejected",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "Usage",
]
