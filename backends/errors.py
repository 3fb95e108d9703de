"""The one error model: every error llmso answers with, as typed exceptions.

``ApiError`` is the base the gateway's one handler renders as an OpenAI envelope
``{"error": {"message", "type", "param", "code"}}`` with ``status`` as the HTTP status
and ``Retry-After`` from ``retry_after``. ``BackendError`` is the part of it that belongs
to the backend contract: what a backend (or the registry in front of it) may raise.
HTTP-only errors (auth, unknown routes, oversized bodies) subclass ``ApiError`` in
``gateway.errors``.

One class per meaning. Class attributes give the defaults (``status``, ``error_type``,
``code``, ``retry_after``); every constructor takes the same keywords, so any error can
be rebuilt from its fields (``fields()``), which is how the process IPC carries them.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Base of every error llmso renders. ``code`` is the OpenAI ``error.code``;
    ``param`` names the offending request field; ``retry_after`` (seconds) becomes the
    ``Retry-After`` header when set."""

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None
    retry_after: float | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if retry_after is not None:
            self.retry_after = float(retry_after)
        if status is not None:
            self.status = status

    def fields(self) -> dict[str, Any]:
        """The keywords that rebuild this error: ``type(self)(message, **fields)``."""
        return {
            "param": self.param,
            "code": self.code,
            "retry_after": self.retry_after,
            "status": self.status,
        }


class BackendError(ApiError):
    """Base of every error a backend may raise; the gateway maps each to an HTTP status."""


class InvalidRequest(BackendError):
    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class UnsupportedFeature(InvalidRequest):
    """The request needs a ``Feature`` the routed backend does not declare."""

    code = "unsupported_feature"


class ModelNotFound(BackendError):
    """No configured model, alias or capability matches the request (never loaded on demand)."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class Overloaded(BackendError):
    """The model cannot take another request now (its bounded queue or its
    ``max_concurrency`` is full); the client should retry later."""

    status = 429
    error_type = "rate_limit_error"
    code = "overloaded"
    retry_after = 1.0


class NotReady(BackendError):
    """The model exists but cannot serve now: loading, draining, failed, or no memory."""

    status = 503
    error_type = "service_unavailable"
    code = "model_not_ready"
    retry_after = 1.0


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


class UpstreamRejected(InvalidRequest):
    """The upstream refused the request (4xx): keep its status, message, param and code."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code, retry_after=retry_after, status=status)


class ContractMismatch(BackendError):
    """A Triton model's tensors are not the LLM contract; the model cannot be served."""

    status = 502
    error_type = "upstream_error"
    code = "triton_contract_mismatch"


class BackendCrashed(BackendError):
    """The engine or its worker died while serving; in-flight requests end with this."""

    status = 503
    error_type = "service_unavailable"
    code = "backend_crashed"


class StepFailed(BackendError):
    """One engine step raised: the requests it was computing end with this; the engine
    itself keeps serving (a retry may well succeed)."""

    status = 500
    error_type = "server_error"
    code = "engine_step_failed"


class WorkerStartError(BackendError):
    """The worker could not load its engine: it failed, died or timed out while loading."""

    status = 503
    error_type = "service_unavailable"
    code = "model_load_failed"


BACKEND_ERRORS: tuple[type[BackendError], ...] = (
    BackendError,
    InvalidRequest,
    ContextLengthExceeded,
    UnsupportedFeature,
    ModelNotFound,
    Overloaded,
    NotReady,
    UpstreamUnavailable,
    UpstreamTimeout,
    UpstreamBadResponse,
    UpstreamRejected,
    ContractMismatch,
    BackendCrashed,
    StepFailed,
    WorkerStartError,
)
"""Every ``BackendError`` class, by which the process IPC names an error it carries."""

__all__ = [
    "BACKEND_ERRORS",
    "ApiError",
    "BackendCrashed",
    "BackendError",
    "ContextLengthExceeded",
    "ContractMismatch",
    "InvalidRequest",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "StepFailed",
    "UnsupportedFeature",
    "UpstreamBadResponse",
    "UpstreamRejected",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "WorkerStartError",
]
