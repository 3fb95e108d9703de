"""The ``Server-Timing`` header: the request timeline, so a browser's dev tools show it.

Metrics (milliseconds, each present only once known when the headers go out):

- ``load``: arrival to the model's lease (name resolution plus any lazy-load wait);
- ``queue``: waiting in the backend's queue before inference started (from the lease on);
- ``ttft``: arrival to the first token (non-streaming responses; a stream sends its
  headers before its first token);
- ``upstream``: time spent waiting on an external server (openai, triton backends);
- ``gateway``: total minus upstream, the gateway's own share;
- ``total``: arrival until the headers were sent.
"""

from __future__ import annotations

from gateway.observe.record import RequestRecord


def queue_seconds(record: RequestRecord) -> float | None:
    """Time in the backend's queue. Some backends (hf) date their queue entry from the
    request's arrival; counting from the lease keeps a lazy load out of ``queue``."""
    start, end = record.queue_start_time, record.inference_start_time
    if start is None or end is None:
        return None
    if record.routed_at is not None:
        start = max(start, record.routed_at)
    return max(0.0, end - start)


def timing_header(record: RequestRecord) -> str:
    total_ms = record.elapsed * 1000.0
    parts: list[str] = []
    if record.routed_at is not None:
        parts.append(f"load;dur={max(0.0, record.routed_at - record.arrival_time) * 1000.0:.2f}")
    queued = queue_seconds(record)
    if queued is not None:
        parts.append(f"queue;dur={queued * 1000.0:.2f}")
    if record.first_token_time is not None:
        parts.append(f"ttft;dur={(record.first_token_time - record.arrival_time) * 1000.0:.2f}")
    upstream = record.upstream_seconds
    if upstream is not None:
        upstream_ms = upstream * 1000.0
        parts.append(f"upstream;dur={upstream_ms:.2f}")
        parts.append(f"gateway;dur={max(0.0, total_ms - upstream_ms):.2f}")
    parts.append(f"total;dur={total_ms:.2f}")
    return ", ".join(parts)
