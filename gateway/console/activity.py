"""What the console and scripts read about recent traffic, fed once per finished request.

``Activity`` is one app's sink for ``RequestRecord.finish`` (see ``GatewayMetrics.
finish_sinks``). It keeps two bounded structures, both owned by the event loop (the sink
and every reader run there, so no lock is needed):

- ``recent``: a ring buffer of the last ``capacity`` request summaries, the timeline
  fields of the request log line and never any prompt or output text;
- ``window``: per model, the finished requests of the last ``WINDOW_SECONDS`` (also capped
  in count), from which ``/admin/stats`` computes rates and percentiles on demand.

Figures come from the records themselves, not from parsing ``/metrics`` text.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.tracking import RequestRecord

WINDOW_SECONDS = 60.0
RECENT_CAPACITY = 500
# A cap per model so a flood of tiny requests cannot grow the window without bound.
WINDOW_MAX_SAMPLES = 20_000

# RequestRecord.status values, by the HTTP class they were answered with.
_CLIENT_ERRORS = frozenset({"client_error"})
_SERVER_ERRORS = frozenset({"server_error", "error"})


def _span(start: float | None, end: float | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, end - start)


@dataclass(frozen=True, slots=True)
class RequestSummary:
    """One finished request as ``/admin/requests`` shows it. Times are ``time.time()``."""

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


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float  # time.monotonic() at finish
    summary: RequestSummary


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
        self._recent: deque[RequestSummary] = deque(maxlen=capacity)
        self._max_samples = max_samples
        self._window: dict[str, deque[_Sample]] = {}
        self._created = time.monotonic()

    def add(self, record: RequestRecord) -> None:
        """The finish sink: O(1), called once per bound request on the event loop."""
        summary = RequestSummary.of(record)
        self._recent.append(summary)
        samples = self._window.get(summary.model)
        if samples is None:
            samples = self._window[summary.model] = deque(maxlen=self._max_samples)
        samples.append(_Sample(time.monotonic(), summary))

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
        samples = self._prune(model, now)
        span = max(1.0, min(self.window_seconds, now - self._created))
        finished = [s.summary for s in samples]
        ttfts = [v for v in (s.ttft for s in finished) if v is not None]
        itls = [v for v in (s.mean_itl for s in finished) if v is not None]
        e2es = [s.e2e for s in finished]
        output = sum(s.output_tokens for s in finished)
        return {
            "requests": len(finished),
            "requests_per_s": len(finished) / span,
            "output_tokens": output,
            "output_tokens_per_s": output / span,
            "ttft_p50_s": percentile(ttfts, 0.5),
            "ttft_p95_s": percentile(ttfts, 0.95),
            "itl_p50_s": percentile(itls, 0.5),
            "itl_p95_s": percentile(itls, 0.95),
            "e2e_p50_s": percentile(e2es, 0.5),
            "e2e_p95_s": percentile(e2es, 0.95),
            "errors_4xx": sum(1 for s in finished if s.status in _CLIENT_ERRORS),
            "errors_5xx": sum(1 for s in finished if s.status in _SERVER_ERRORS),
            "disconnects": sum(1 for s in finished if s.status == "disconnected"),
            "series": self._series(samples, now),
        }

    def _series(self, samples: Iterable[_Sample], now: float) -> dict[str, Any]:
        """Per-second buckets, oldest first, the last one ending ``now``."""
        size = math.ceil(self.window_seconds)
        requests = [0] * size
        tokens = [0] * size
        errors = [0] * size
        for sample in samples:
            age = int(now - sample.at)
            if 0 <= age < size:
                slot = size - 1 - age
                requests[slot] += 1
                tokens[slot] += sample.summary.output_tokens
                if sample.summary.status in _CLIENT_ERRORS | _SERVER_ERRORS:
                    errors[slot] += 1
        return {"step_s": 1, "requests": requests, "output_tokens": tokens, "errors": errors}

    def _prune(self, model: str, now: float) -> list[_Sample]:
        samples = self._window.get(model)
        if samples is None:
            return []
        horizon = now - self.window_seconds
        while samples and samples[0].at < horizon:
            samples.popleft()
        if not samples:
            del self._window[model]
        return list(samples)
