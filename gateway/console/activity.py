"""What the console and scripts read about recent traffic, fed once per finished request.

``Activity`` is one app's sink for ``RequestRecord.finish`` (see ``FrontDoor.
finish_sinks``). It keeps two bounded structures, both owned by the event loop (the sink
and every reader run there, so no lock is needed):

- ``recent``: a ring buffer of the last ``capacity`` request summaries, the timeline
  fields of the request log line and never any prompt or output text;
- ``window``: per model, exact per-second counts over the last ``WINDOW_SECONDS`` and the
  latencies of at most the newest ``WINDOW_MAX_SAMPLES`` requests in it, from which
  ``/admin/stats`` computes rates and percentiles on demand.

Figures come from the records themselves, not from parsing ``/metrics`` text.
``Activity.snapshot`` gives one model's window as plain data and ``summarize`` turns one
or more snapshots into the figures, so a fleet's workers add up to one console.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.observe.record import RequestRecord

WINDOW_SECONDS = 60.0
RECENT_CAPACITY = 500
# Latency percentiles use at most the newest this many requests per model, so a poll
# costs the same at any request rate (counts and rates stay exact).
WINDOW_MAX_SAMPLES = 2048

# RequestRecord.status values, by the HTTP class they were answered with.
_CLIENT_ERRORS = frozenset({"client_error"})
_SERVER_ERRORS = frozenset({"server_error", "error"})


def _span(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, end - start)


class RequestSummary(NamedTuple):
    """One finished request as ``/admin/requests`` shows it. Times are ``time.time()``.

    A named tuple, not a frozen dataclass: one is built per request on the hot path, and
    a frozen dataclass sets each of its 15 fields through ``object.__setattr__`` (~3x
    the cost)."""

    request_id: str
    requested_model: str
    model: str
    backend: str
    status: str
    error_type: str | None
    arrival_time: float
    queue_start_time: float | None
    inference_start_time: float | None
    first_token_time: float | None
    finish_time: float
    input_tokens: int
    output_tokens: int
    mean_itl: float | None
    fallback_from: tuple[str, ...]

    @classmethod
    def of(cls, record: RequestRecord) -> RequestSummary:
        return cls(
            request_id=record.request_id,
            requested_model=record.requested_model,
            model=record.model or record.requested_model,
            backend=record.backend,
            status=record.status,
            error_type=record.error_type,
            arrival_time=record.arrival_time,
            queue_start_time=record.queue_start_time,
            inference_start_time=record.inference_start_time,
            first_token_time=record.first_token_time,
            finish_time=record.finish_time or time.time(),
            input_tokens=record.input_tokens,
            output_tokens=record.output_tokens,
            mean_itl=record.mean_itl,
            fallback_from=tuple(record.fallback_from),
        )

    @property
    def ttft(self) -> float | None:
        return _span(self.arrival_time, self.first_token_time)

    @property
    def e2e(self) -> float:
        return max(0.0, self.finish_time - self.arrival_time)

    @property
    def queue(self) -> float | None:
        return _span(self.queue_start_time, self.inference_start_time)

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "requested_model": self.requested_model,
            "model": self.model,
            "backend": self.backend or None,
            "status": self.status,
            "error_type": self.error_type,
            "arrival_time": self.arrival_time,
            "queue_start_time": self.queue_start_time,
            "inference_start_time": self.inference_start_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
            "queue_s": self.queue,
            "ttft_s": self.ttft,
            "e2e_s": self.e2e,
            "itl_s": self.mean_itl,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "fallback_from": list(self.fallback_from) or None,
        }


@dataclass(slots=True)
class _Second:
    """Exact counts for the requests that finished in one second of ``time.monotonic()``."""

    second: int
    requests: int = 0
    output_tokens: int = 0
    errors_4xx: int = 0
    errors_5xx: int = 0
    disconnects: int = 0


class _ModelWindow:
    """One model's window: per-second counts (at most one bucket per second of the window)
    and the latencies of at most the newest ``max_samples`` requests in it, so a poll
    costs the same whatever the request rate."""

    def __init__(self, max_samples: int) -> None:
        self.seconds: deque[_Second] = deque()
        # (finished at, ttft, mean itl, e2e)
        self.latencies: deque[tuple[float, float | None, float | None, float]] = deque(
            maxlen=max_samples
        )

    def add(self, at: float, summary: RequestSummary) -> None:
        second = int(at)
        if not self.seconds or self.seconds[-1].second != second:
            self.seconds.append(_Second(second))
        bucket = self.seconds[-1]
        bucket.requests += 1
        bucket.output_tokens += summary.output_tokens
        bucket.errors_4xx += summary.status in _CLIENT_ERRORS
        bucket.errors_5xx += summary.status in _SERVER_ERRORS
        bucket.disconnects += summary.status == "disconnected"
        self.latencies.append((at, summary.ttft, summary.mean_itl, summary.e2e))

    def prune(self, now: float, size: int) -> None:
        """Drop what is older than the ``size`` seconds ending at ``now``."""
        oldest = int(now) - size + 1
        while self.seconds and self.seconds[0].second < oldest:
            self.seconds.popleft()
        while self.latencies and self.latencies[0][0] < oldest:
            self.latencies.popleft()


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class Activity:
    """Recent requests and the per-model stats window of one app (owned by its loop)."""

    def __init__(
        self,
        *,
        capacity: int = RECENT_CAPACITY,
        window_seconds: float = WINDOW_SECONDS,
        max_samples: int = WINDOW_MAX_SAMPLES,
    ) -> None:
        self.window_seconds = window_seconds
        self._size = math.ceil(window_seconds)
        self._recent: deque[RequestSummary] = deque(maxlen=capacity)
        self._max_samples = max_samples
        self._window: dict[str, _ModelWindow] = {}
        self._created = time.monotonic()

    def add(self, record: RequestRecord) -> None:
        """The finish sink: O(1) amortised, called once per finished request on the loop."""
        if not record.model:
            self.add_refused(record)
            return
        summary = RequestSummary.of(record)
        self._recent.append(summary)
        window = self._window.get(summary.model)
        if window is None:
            window = self._window[summary.model] = _ModelWindow(self._max_samples)
        now = time.monotonic()
        window.add(now, summary)
        window.prune(now, self._size)

    def add_refused(self, record: RequestRecord) -> None:
        """A request refused before any model was bound (bad body, unknown model, a
        feature no backend has): it goes to the recent list only, since its requested
        name is the client's free text and must not become a stats key."""
        self._recent.append(RequestSummary.of(record))

    def recent(
        self, *, model: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[RequestSummary]:
        """Newest first, filtered by model (name or requested name) and status."""
        found: list[RequestSummary] = []
        for summary in reversed(self._recent):
            if model is not None and model not in (summary.model, summary.requested_model):
                continue
            if status is not None and summary.status != status:
                continue
            found.append(summary)
            if len(found) >= limit:
                break
        return found

    def models(self) -> list[str]:
        return list(self._window)

    def summary(self, model: str, now: float | None = None) -> dict[str, Any]:
        """Rates, percentiles and a per-second series over the window for one model."""
        now = time.monotonic() if now is None else now
        return summarize([self.snapshot(model, now)], now, self._size)

    def snapshot(self, model: str, now: float | None = None) -> dict[str, Any]:
        """One model's window as it stands, JSON-able: what ``summarize`` turns into
        figures, and what a fleet's workers send so one console shows them all (each
        worker's per-second buckets line up: ``time.monotonic`` is the host's clock)."""
        now = time.monotonic() if now is None else now
        window = self._window.get(model) or _ModelWindow(1)
        window.prune(now, self._size)
        if not window.seconds and model in self._window:
            del self._window[model]
        return {
            "span": max(1.0, min(self.window_seconds, now - self._created)),
            "seconds": [
                [b.second, b.requests, b.output_tokens, b.errors_4xx, b.errors_5xx, b.disconnects]
                for b in window.seconds
            ],
            "ttft": [ttft for _, ttft, _, _ in window.latencies if ttft is not None],
            "itl": [itl for _, _, itl, _ in window.latencies if itl is not None],
            "e2e": [e2e for _, _, _, e2e in window.latencies],
        }


def summarize(snapshots: Iterable[dict[str, Any]], now: float, size: int) -> dict[str, Any]:
    """The ``/admin/stats`` figures of one model from one or more ``Activity.snapshot``
    (a fleet's workers': their counts added, their latencies pooled)."""
    buckets: dict[int, _Second] = {}
    ttfts: list[float] = []
    itls: list[float] = []
    e2es: list[float] = []
    span = 1.0
    for snapshot in snapshots:
        span = max(span, snapshot["span"])
        for second, *counts in snapshot["seconds"]:
            bucket = buckets.get(second)
            if bucket is None:
                bucket = buckets[second] = _Second(second)
            bucket.requests += counts[0]
            bucket.output_tokens += counts[1]
            bucket.errors_4xx += counts[2]
            bucket.errors_5xx += counts[3]
            bucket.disconnects += counts[4]
        ttfts += snapshot["ttft"]
        itls += snapshot["itl"]
        e2es += snapshot["e2e"]
    seconds = list(buckets.values())
    requests = sum(b.requests for b in seconds)
    output = sum(b.output_tokens for b in seconds)
    return {
        "requests": requests,
        "requests_per_s": requests / span,
        "output_tokens": output,
        "output_tokens_per_s": output / span,
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "itl_p50_s": percentile(itls, 0.5),
        "itl_p95_s": percentile(itls, 0.95),
        "e2e_p50_s": percentile(e2es, 0.5),
        "e2e_p95_s": percentile(e2es, 0.95),
        "errors_4xx": sum(b.errors_4xx for b in seconds),
        "errors_5xx": sum(b.errors_5xx for b in seconds),
        "disconnects": sum(b.disconnects for b in seconds),
        "series": _series(seconds, now, size),
    }


def _series(seconds: Iterable[_Second], now: float, size: int) -> dict[str, Any]:
    """Per-second buckets, oldest first, the last one the current second."""
    requests, tokens, errors = [0] * size, [0] * size, [0] * size
    for bucket in seconds:
        slot = size - 1 - (int(now) - bucket.second)
        if 0 <= slot < size:
            requests[slot] = bucket.requests
            tokens[slot] = bucket.output_tokens
            errors[slot] = bucket.errors_4xx + bucket.errors_5xx
    return {"step_s": 1, "requests": requests, "output_tokens": tokens, "errors": errors}
