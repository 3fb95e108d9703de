"""Triton's failures as the backend contract's errors (pure)."""

from __future__ import annotations

import grpc
from tritonclient.utils import InferenceServerException

from backends.base import (
    BackendError,
    NotReady,
    Overloaded,
    UpstreamBadResponse,
    UpstreamTimeout,
    UpstreamUnavailable,
)

RETRY_AFTER = 2.0
# Triton's words for a model that is not (yet) there; they arrive as stream errors.
_NOT_READY_HINTS = ("unknown model", "not ready", "no available version", "is not found")


def retryable(error: BackendError) -> bool:
    """Whether another replica may serve the request: this one was unreachable, busy,
    or did not have the model ready (nothing reached the client yet)."""
    return isinstance(error, UpstreamUnavailable | Overloaded | NotReady)


def status_of(error: BackendError) -> str:
    """The ``status`` label of ``llmso_upstream_requests_total`` for a failed request."""
    if isinstance(error, UpstreamTimeout):
        return "timeout"
    if isinstance(error, NotReady):
        return "unavailable"
    return "error"


def _unsent(exc: grpc.aio.AioRpcError) -> bool:
    """gRPC Python reports a message it could not send on a connection that broke under
    it (a server killed a moment ago) as INTERNAL, "Internal error from Core", its debug
    string naming the failed send batch (grpc/grpc#36066), not as UNAVAILABLE: the
    request never reached a server, so another replica may take it."""
    debug = exc.debug_error_string() or ""
    return exc.code() == grpc.StatusCode.INTERNAL and "SendMessageOperation" in debug


def map_rpc_error(exc: grpc.aio.AioRpcError, url: str) -> BackendError:
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE or _unsent(exc):
        return UpstreamUnavailable(
            f"Triton at {url} is unavailable: {exc.details()}", retry_after=RETRY_AFTER
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UpstreamTimeout(f"Triton at {url}: deadline exceeded")
    if code == grpc.StatusCode.CANCELLED:
        return UpstreamUnavailable(f"Triton at {url} cancelled the stream", retry_after=RETRY_AFTER)
    return UpstreamBadResponse(f"Triton at {url}: {code.name}: {exc.details()}")


def map_client_error(exc: InferenceServerException, url: str) -> BackendError:
    status = str(exc.status() or "")
    message = exc.message() or str(exc)
    if "UNAVAILABLE" in status:
        return UpstreamUnavailable(f"Triton at {url} is unavailable: {message}")
    if "DEADLINE_EXCEEDED" in status:
        return UpstreamTimeout(f"Triton at {url}: no answer in time")
    if "NOT_FOUND" in status or any(h in message.lower() for h in _NOT_READY_HINTS):
        return NotReady(f"Triton at {url}: {message}", retry_after=RETRY_AFTER)
    return UpstreamBadResponse(f"Triton at {url}: {message}")


def map_stream_error(message: str, model: str) -> BackendError:
    lowered = message.lower()
    if any(hint in lowered for hint in _NOT_READY_HINTS):
        return NotReady(f"Triton model {model!r} is not ready: {message}", retry_after=RETRY_AFTER)
    if "queue is full" in lowered:
        return Overloaded(f"Triton model {model!r} is busy: {message}", retry_after=RETRY_AFTER)
    if "unavailable" in lowered:
        return UpstreamUnavailable(f"Triton model {model!r}: {message}", retry_after=RETRY_AFTER)
    return UpstreamBadResponse(f"Triton model {model!r} failed: {message}")
