"""The refusals of admission: over a rate limit, out of daily quota, over the spend
budget, or the limit store down under ``on_store_error: deny``. ``ApiError``s, so the one
renderer shows them (in the envelope of the route's API)."""

from __future__ import annotations

from backends.errors import ApiError


class _Retryable(ApiError):
    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message, retry_after=retry_after)


class RateLimited(_Retryable):
    """Over ``rpm`` (type ``requests``), ``tpm`` (``tokens``) or ``max_parallel``."""

    status = 429
    error_type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: float, kind: str = "requests") -> None:
        super().__init__(message, retry_after=retry_after)
        self.error_type = kind


class QuotaExceeded(_Retryable):
    status = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


class BudgetExceeded(_Retryable):
    """The key spent its ``max_budget`` for the current ``budget_period``."""

    status = 429
    error_type = "budget_exceeded"
    code = "budget_exceeded"


class StoreUnavailable(_Retryable):
    """The limit store failed and ``limits.on_store_error`` is ``deny``."""

    status = 503
    error_type = "service_unavailable"
    code = "limit_store_unavailable"
