"""The ``Server-Timing`` header: the request timeline, so a browser's dev tools show it.

Metrics (milliseconds, each present only once known when the headers go out):

- ``load``: arrival to the model's lease (name resolution plus any lazy-load wait);
- ``queue``: waiting in the backend's queue before inference started;
- ``ttft``: arrival to the first token (non-streaming responses; a stream sends its
  headers before its first token);
- ``upstream``: time spent waiting on an external server (openai, triton backends);
- ``gateway``: total minus upstream, the gateway's own share;
- ``total``: arrival until the headers were sent.
"""

from __future__ import annotations

from gateway.tracking import RequestRecord


def timing_header(record: RequestRecord) -> str:
    total_ms = record.elapsed * 1000.0
    parts: list[str] = []
    if record.routed_at is not None:
        parts.append(f"load;dur={max(0.0, record.routed_at - record.arrival_time) * 1000.0:.2f}")
    if record.inference_start_time is not None and record.queue_start_time is not None:
        queue_ms = max(0.0, record.inference_start_time - record.queue_start_time) * 1000.0
        parts.append(f"queue;dur={queue_ms:.2f}")
    if record.first_token_time is not None:
        parts.append(f"ttft;dur={(record.first_token_time - record.arrival_time) * 1000.0:.2f}")
    upstream = record.upstream_seconds
    if upstream is not None:
        upstream_ms = upstream * 1000.0
        parts.append(f"upstream;dur={upstream_ms:.2f}")
        parts.append(f"gateway;dur={max(0.0, total_ms - upstream_ms):.2f}")
    parts.append(f"total;dur={total_ms:.2f}")
    return ", ".join(parts)
