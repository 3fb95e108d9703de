"""The request tracker: one record per request, its timestamps, metrics and log line.

A ``RequestRecord`` is owned by the task serving its request and is mutated only there.
``finish()`` is idempotent: the first call observes metrics and writes the one structured
JSON log line the design asks for; later calls do nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import orjson

from backends.base import BackendEvent, Started, TextDelta, Usage
from gateway.metrics import GatewayMetrics

request_log = logging.getLogger("llmso.requests")


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    requested_model: str
    arrival_time: float = field(default_factory=time.time)
    arrival_mono: float = field(default_factory=time.perf_counter)
    model: str = ""
    backend: str = ""
    queue_start_time: float | None = None
    inference_start_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    upstream_seconds: float | None = None
    status: str = "ok"
    error_type: str | None = None
    fallback_from: list[str] = field(default_factory=list)
    _last_token_mono: float | None = None
    _metrics: GatewayMetrics | None = None
    _finished: bool = False

    def bind(self, model: str, backend: str, metrics: GatewayMetrics) -> None:
        """Attach the model that will answer; from here on the request counts as in flight."""
        self.model, self.backend, self._metrics = model, backend, metrics
        self.queue_start_time = time.time()
        metrics.inflight.labels(model, backend).inc()

    def observe(self, event: BackendEvent) -> None:
        if isinstance(event, TextDelta):
            self._on_text()
        elif isinstance(event, Started):
            self.queue_start_time = event.queued_at
            self.inference_start_time = event.started_at
        elif isinstance(event, Usage):
            self.input_tokens = event.prompt_tokens
            self.output_tokens = event.completion_tokens
            self.upstream_seconds = event.upstream_seconds

    def _on_text(self) -> None:
        now = time.perf_counter()
        metrics = self._metrics
        if self._last_token_mono is None:
            self.first_token_time = time.time()
            if metrics is not None:
                metrics.ttft.labels(self.model, self.backend).observe(now - self.arrival_mono)
        elif metrics is not None:
            metrics.itl.labels(self.model, self.backend).observe(now - self._last_token_mono)
        self._last_token_mono = now

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.arrival_mono

    def fail(self, status: str, error_type: str | None) -> None:
        self.status, self.error_type = status, error_type

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.finish_time = time.time()
        metrics = self._metrics
        if metrics is not None:
            self._observe_finish(metrics)
        request_log.info(orjson.dumps(self.log_fields()).decode())

    def _observe_finish(self, metrics: GatewayMetrics) -> None:
        labels = (self.model, self.backend)
        metrics.inflight.labels(*labels).dec()
        metrics.requests.labels(*labels, self.status).inc()
        metrics.duration.labels(*labels).observe(self.elapsed)
        if self.inference_start_time is not None and self.queue_start_time is not None:
            wait = max(0.0, self.inference_start_time - self.queue_start_time)
            metrics.queue_time.labels(*labels).observe(wait)
        metrics.prompt_tokens.labels(*labels).inc(self.input_tokens)
        metrics.generation_tokens.labels(*labels).inc(self.output_tokens)
        metrics.request_prompt_tokens.labels(*labels).observe(self.input_tokens)
        metrics.request_generation_tokens.labels(*labels).observe(self.output_tokens)
        if self.status == "disconnected":
            metrics.disconnects.labels(*labels).inc()

    def log_fields(self) -> dict[str, object]:
        return {
            "event": "request_finished",
            "request_id": self.request_id,
            "model": self.model or self.requested_model,
            "backend": self.backend or None,
            "arrival_time": self.arrival_time,
            "queue_start_time": self.queue_start_time,
            "inference_start_time": self.inference_start_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "status": self.status,
            "error_type": self.error_type,
            "fallback_from": self.fallback_from or None,
        }
