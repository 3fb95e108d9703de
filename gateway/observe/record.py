"""The request tracker: one record per request, its timestamps, metrics and log line.

A ``RequestRecord`` is owned by the task serving its request and is mutated only there.
``finish()`` is idempotent: the first call observes metrics and writes the one structured
JSON log line the design asks for; later calls do nothing. ``cost()`` prices what the
request is billed (``billed()``) at the answering model's ``pricing:``
(``gateway.observe.cost``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from backends.base import (
    BackendEvent,
    Finished,
    GenerationRequest,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from config.pricing import PricingConfig
from gateway.observe.cost import cost_pico, usd
from gateway.observe.logs import REQUEST_LOGGER
from gateway.observe.metrics import GatewayMetrics, ModelSeries

request_log = logging.getLogger(REQUEST_LOGGER)

UNROUTED = "unrouted"
"""The ``model`` label of a request refused before it was routed to a model."""


class Trace(Protocol):
    """What the request path asks of a request's trace (``gateway.observe.tracing.RequestTrace``,
    which imports this module: the record only holds it)."""

    status_code: int | None

    def requested(self, request: GenerationRequest) -> None: ...

    def enter_backend(self, request: GenerationRequest, backend: str) -> GenerationRequest: ...

    def end(self, record: RequestRecord, end_time: float) -> None: ...


FinishSink = Callable[["RequestRecord"], None]
"""Called with each finished record, routed or refused before routing (``model`` empty),
on the loop: in-process consumers such as the console's stats window."""


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    requested_model: str
    endpoint: str = ""  # the public route's path (bounded: one per endpoint)
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
    reasoning_tokens: int = 0  # the part of output_tokens that was thought
    cached_tokens: int = 0  # the part of input_tokens read from a prefix cache
    reasoning_ignored: str | None = None  # controls a model without a reasoning parser dropped
    upstream_seconds: float | None = None
    resumes: int = 0  # times a broken upstream stream resumed on another replica
    resume_prompt_tokens: int = 0  # prompt tokens those resumes cost (not billed)
    status: str = "ok"
    error_type: str | None = None
    fallback_from: list[str] = field(default_factory=list)
    text_events: int = 0
    _first_token_mono: float | None = None
    routed_at: float | None = None  # time.time() when the first model's lease was held
    finish_reasons: list[str] = field(default_factory=list)
    closed_by_budget: bool = False  # a choice's value was closed because max_tokens was near
    trace: Trace | None = None  # set only when tracing is on (gateway.observe.tracing)
    key: str | None = None  # the client key's configured name, never the key
    streamed_tokens: int = 0  # tokens seen so far, for requests cut short before Usage
    may_use: Callable[[str], bool] | None = None  # the client key's model allow-list
    batch_id: str | None = None  # set when the request is a line of that batch
    adapter: str | None = None  # the LoRA adapter that answered with its base ``model``
    route: str | None = None  # the split route requested; ``model`` is the target it picked
    mirror_of: str | None = None  # a mirror's: the id of the request it copies
    prompt_estimate: int = 0  # the admission's prompt estimate, billed for a cut stream
    pricing: PricingConfig | None = None  # the answering model's prices (set by ``bind``)
    _last_token_mono: float | None = None
    _metrics: GatewayMetrics | None = None
    _sinks: Sequence[FinishSink] = ()
    _series: ModelSeries | None = None
    _finished: bool = False

    def bind(
        self,
        model: str,
        backend: str,
        metrics: GatewayMetrics,
        pricing: PricingConfig | None = None,
    ) -> None:
        """Attach the model that will answer (and its prices); from here on the request
        counts as in flight.

        A fallback binds again to the next model: the first binding is then undone.
        """
        if self._series is not None:
            self._series.inflight.dec()
        self.model, self.backend, self._metrics = model, backend, metrics
        self.pricing = pricing
        self._series = metrics.series(model, backend)
        self.queue_start_time = time.time()
        if self.routed_at is None:
            self.routed_at = self.queue_start_time
        self._series.inflight.inc()

    def observe(self, event: BackendEvent) -> None:
        if type(event) is TextDelta:  # the stream's every delta: the quickest test first
            self.streamed_tokens += event.num_tokens
            self._on_text()
        elif isinstance(event, TextDelta | ToolCallDelta | ReasoningDelta):
            if not isinstance(event, ToolCallDelta):
                self.streamed_tokens += event.num_tokens
            self._on_text()
        elif isinstance(event, Started):
            self.queue_start_time = event.queued_at
            self.inference_start_time = event.started_at
        elif isinstance(event, Finished):
            self.finish_reasons.append(event.reason)
            self.closed_by_budget = self.closed_by_budget or event.closed_by_budget
        elif isinstance(event, Usage):
            self.input_tokens = event.prompt_tokens
            self.output_tokens = event.completion_tokens
            self.reasoning_tokens = event.reasoning_tokens
            self.cached_tokens = event.cached_tokens
            self.upstream_seconds = event.upstream_seconds
            self.resumes = event.resumes
            self.resume_prompt_tokens = event.resume_prompt_tokens

    def _on_text(self) -> None:
        now = time.perf_counter()
        series = self._series
        self.text_events += 1
        if self._last_token_mono is None:
            self.first_token_time = time.time()
            self._first_token_mono = now
            if series is not None:
                series.ttft.observe(now - self.arrival_mono)
        elif series is not None:
            series.itl.observe(now - self._last_token_mono)
        self._last_token_mono = now

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.arrival_mono

    @property
    def mean_itl(self) -> float | None:
        """Mean gap between consecutive text deltas; ``None`` with fewer than two."""
        first, last = self._first_token_mono, self._last_token_mono
        if first is None or last is None or self.text_events < 2:
            return None
        return (last - first) / (self.text_events - 1)

    def billed(self) -> tuple[int, int, int]:
        """``(prompt, cached, completion)`` tokens the request is charged: the backend's
        usage; for a request cut short before it (a client gone mid-stream), the prompt
        estimate and the tokens generated so far; nothing when nothing was generated."""
        if self.input_tokens > 0:
            cached = min(self.cached_tokens, self.input_tokens)
            return self.input_tokens, cached, self.output_tokens
        if self.streamed_tokens > 0:
            return self.prompt_estimate, 0, self.streamed_tokens
        return 0, 0, 0

    def cost(self) -> int | None:
        """What the request costs so far, in picodollars; ``None`` when no model with
        prices answered it. A batch line's at the batch discount."""
        pricing = self.pricing
        if pricing is None:
            return None
        prompt, cached, completion = self.billed()
        return cost_pico(pricing, prompt, cached, completion, batch=self.batch_id is not None)

    def track(self, metrics: GatewayMetrics, sinks: Sequence[FinishSink] = ()) -> None:
        """Count this request even if it never reaches a model (label ``unrouted``), and
        hand it to ``sinks`` when it finishes."""
        self._metrics = metrics
        self._sinks = sinks

    def fail(self, status: str, error_type: str | None) -> None:
        self.status, self.error_type = status, error_type

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.finish_time = time.time()
        if self._metrics is not None:
            if self._series is not None:
                self._observe_finish(self._metrics, self._series)
            else:
                self._metrics.finished(UNROUTED, "none", self.status, self.endpoint_label)
        for sink in self._sinks:
            sink(self)
        if request_log.isEnabledFor(logging.INFO):
            request_log.info(orjson.dumps(self.log_fields()).decode())

    @property
    def endpoint_label(self) -> str:
        """The ``endpoint`` label: the API path, ``batch:<path>`` for a batch's line,
        ``mirror:<path>`` for a mirror's copy."""
        if self.mirror_of is not None:
            return f"mirror:{self.endpoint}"
        return f"batch:{self.endpoint}" if self.batch_id else self.endpoint

    def _observe_finish(self, metrics: GatewayMetrics, series: ModelSeries) -> None:
        series.inflight.dec()
        metrics.finished(self.model, self.backend, self.status, self.endpoint_label)
        series.duration.observe(self.elapsed)
        if self.inference_start_time is not None and self.queue_start_time is not None:
            series.queue_time.observe(max(0.0, self.inference_start_time - self.queue_start_time))
        series.prompt_tokens.inc(self.input_tokens)
        series.generation_tokens.inc(self.output_tokens)
        if self.reasoning_tokens:
            series.reasoning_tokens.inc(self.reasoning_tokens)
        series.request_prompt_tokens.observe(self.input_tokens)
        series.request_generation_tokens.observe(self.output_tokens)
        if self.status == "disconnected":
            series.disconnects.inc()
        if self.closed_by_budget:
            series.closed_by_budget.inc()
        if self.adapter is not None:
            metrics.adapter_finished(self.model, self.adapter, self.status, self.output_tokens)

    def log_fields(self) -> dict[str, object]:
        cost = self.cost()
        return {
            "event": "request_finished",
            "request_id": self.request_id,
            "endpoint": self.endpoint or None,
            "model": self.model or self.requested_model or UNROUTED,
            "adapter": self.adapter,
            "route": self.route,
            "mirror_of": self.mirror_of,
            "key": self.key,
            "batch_id": self.batch_id,
            "backend": self.backend or None,
            "arrival_time": self.arrival_time,
            "queue_start_time": self.queue_start_time,
            "inference_start_time": self.inference_start_time,
            "first_token_time": self.first_token_time,
            "finish_time": self.finish_time,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_ignored": self.reasoning_ignored,
            "status": self.status,
            "error_type": self.error_type,
            "fallback_from": self.fallback_from or None,
            "resumes": self.resumes,
            "resume_prompt_tokens": self.resume_prompt_tokens,
            "closed_by_budget": self.closed_by_budget,
            "cost_usd": None if cost is None else usd(cost),
        }
