"""The backend contract: what the gateway hands a backend, and what it gets back.

Everything here is plain data (frozen, slotted dataclasses) or a Protocol. The gateway
translates wire types into a ``GenerationRequest`` once; a backend turns it into an
async stream of ``BackendEvent`` values and raises ``BackendError`` subclasses when it
cannot. Backends never see HTTP, and the gateway never sees tensors.

Event order for one request: zero or one ``Started``; then per choice index any number
of ``TextDelta`` followed by exactly one ``Finished``; then exactly one ``Usage`` last.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


class RequestKind(Enum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Literal["system", "user", "assistant", "developer"]
    content: str


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request decoding controls, already validated and clamped by the gateway.

    ``temperature == 0`` means greedy. ``top_k == 0`` means no top-k cut.
    ``logprobs`` is ``None`` when off, else the number of top alternatives (0..20)
    to return next to each sampled token's own log-probability.
    """

    max_tokens: int
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


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One validated generation call.

    ``messages`` is set for chat requests, ``prompt`` for completions. Backends that own
    a tokenizer render the chat template themselves; proxies forward messages as they are.
    ``max_tokens_explicit`` tells a backend whether the client set a limit (a proxy only
    forwards a limit the client asked for). ``arrival_time`` is ``time.time()`` at the edge.
    """

    request_id: str
    model: str
    kind: RequestKind
    sampling: SamplingParams
    messages: tuple[ChatMessage, ...] = ()
    prompt: str = ""
    max_tokens_explicit: bool = True
    arrival_time: float = 0.0
    user: str | None = None
    session_id: str | None = None
    """The client's ``x-session-id`` header: a key for replica affinity, never sent on."""


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[TopLogprob, ...] = ()


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
class Finished:
    index: int
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts, always the last event. ``upstream_seconds`` is the time this request
    spent waiting on an external server (proxies, Triton), so the gateway can report its
    own overhead; ``None`` for in-process backends."""

    prompt_tokens: int
    completion_tokens: int
    upstream_seconds: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


BackendEvent = Started | TextDelta | Finished | Usage


class Feature(Enum):
    """A request feature a backend may or may not honour.

    A backend declares what it serves in ``ModelInfo.features``; the gateway refuses a
    request that needs a feature the routed backend lacks with a 400 naming the request
    field (``gateway.capabilities``), so the decision is the backend's, never a guess.
    """

    CHAT = "chat"
    COMPLETION = "completion"
    LOGPROBS = "logprobs"
    TOOLS = "tools"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    IMAGE_INPUT = "image_input"
    EMBEDDINGS = "embeddings"


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


# --------------------------------------------------------------------------- errors


class BackendError(Exception):
    """Base of every error a backend may raise. The gateway maps each to an HTTP status.

    ``code`` is the OpenAI ``error.code``; ``param`` names the offending request field.
    """

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(BackendError):
    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class UnsupportedFeature(InvalidRequest):
    """The request needs a ``Feature`` the routed backend does not declare."""

    code = "unsupported_feature"


class Overloaded(BackendError):
    """The backend's bounded queue is full; the client should retry later."""

    status = 429
    error_type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotReady(BackendError):
    status = 503
    error_type = "service_unavailable"
    code = "model_not_ready"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamUnavailable(NotReady):
    code = "upstream_unavailable"


class UpstreamTimeout(BackendError):
    status = 504
    error_type = "timeout"
    code = "upstream_timeout"


class UpstreamBadResponse(BackendError):
    status = 502
    error_type = "upstream_error"
    code = "bad_upstream_response"


class UpstreamRejected(BackendError):
    """The upstream answered 4xx: keep its status and message."""

    error_type = "invalid_request_error"

    def __init__(
        self, message: str, *, status: int, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, param=param)
        self.status = status
        self.code = code


class BackendCrashed(BackendError):
    """The engine or its worker died while serving; in-flight requests end with this."""

    status = 503
    error_type = "service_unavailable"
    code = "backend_crashed"


# --------------------------------------------------------------------------- protocol


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
