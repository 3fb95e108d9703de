"""Typed registry errors. Each is a ``BackendError`` so the gateway's one handler renders
the OpenAI envelope with the right status (and ``Retry-After`` where there is one)."""

from __future__ import annotations

from backends.base import BackendError


class ModelNotFound(BackendError):
    """No configured model, alias or capability matches the request (never loaded on demand)."""

    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class ModelUnavailable(BackendError):
    """The model exists but cannot serve now: loading, draining, failed, or no memory."""

    status = 503
    error_type = "service_unavailable"
    code = "model_not_ready"

    def __init__(self, message: str, *, retry_after: float = 1.0, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class ModelOverloaded(BackendError):
    """The model already serves ``max_concurrency`` requests."""

    status = 429
    error_type = "rate_limit_error"
    code = "model_overloaded"

    def __init__(self, message: str, *, retry_after: float = 1.0, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after
