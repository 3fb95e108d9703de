"""Gateway-hop Prometheus families, on a registry owned by one app (never the global one).

Labels are bounded: model, backend, status, and on ``llmso_requests_total`` the
endpoint (the public route's path; ``batch:<path>`` for a batch's line, ``mirror:<path>``
for a mirror's copy). Histograms use base units (seconds, tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from backends.hop_metrics import LATENCY_BUCKETS
from backends.metric_types import LoopCounter, LoopGauge, LoopHistogram

TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True, slots=True)
class ModelSeries:
    """The labelled children of every family for one (model, backend) pair.

    Looked up once per pair and cached, so the per-token path never pays for
    ``labels()`` (a dict lookup over a tuple of label values each time).
    """

    ttft: Any
    itl: Any
    duration: Any
    queue_time: Any
    prompt_tokens: Any
    generation_tokens: Any
    request_prompt_tokens: Any
    request_generation_tokens: Any
    inflight: Any
    disconnects: Any
    closed_by_budget: Any
    reasoning_tokens: Any


class GatewayMetrics:
    """Families observed once per request (and per token for inter-token latency).

    Owned by one app; ``series`` caches children and is only called on the event loop.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._series: dict[tuple[str, str], ModelSeries] = {}
        self._finished: dict[tuple[str, str, str, str], Any] = {}
        hop = ("model", "backend")
        self.requests = LoopCounter(
            "llmso_requests_total",
            "Finished requests by outcome and API endpoint (a batch line's: batch:<its url>; "
            "a mirror's copy: mirror:<its url>).",
            (*hop, "status", "endpoint"),
            registry=registry,
        )
        self.duration = LoopHistogram(
            "llmso_request_duration_seconds",
            "End-to-end request latency at the gateway.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = LoopHistogram(
            "llmso_time_to_first_token_seconds",
            "Arrival to first generated text.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.itl = LoopHistogram(
            "llmso_inter_token_latency_seconds",
            "Gap between consecutive text deltas.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_time = LoopHistogram(
            "llmso_queue_time_seconds",
            "Time waiting before inference started.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = LoopCounter(
            "llmso_prompt_tokens_total",
            "Prompt tokens processed.",
            hop,
            registry=registry,
        )
        self.generation_tokens = LoopCounter(
            "llmso_generation_tokens_total",
            "Tokens generated.",
            hop,
            registry=registry,
        )
        self.reasoning_tokens = LoopCounter(
            "llmso_reasoning_tokens_total",
            "Generated tokens that were a reasoning model's thought (part of "
            "llmso_generation_tokens_total).",
            hop,
            registry=registry,
        )
        self.request_prompt_tokens = LoopHistogram(
            "llmso_request_prompt_tokens",
            "Prompt tokens per request.",
            hop,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.request_generation_tokens = LoopHistogram(
            "llmso_request_generation_tokens",
            "Generated tokens per request.",
            hop,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.inflight = LoopGauge(
            "llmso_inflight_requests",
            "Requests being served.",
            hop,
            registry=registry,
        )
        self.disconnects = LoopCounter(
            "llmso_client_disconnects_total",
            "Requests whose client left before the end.",
            hop,
            registry=registry,
        )
        self.closed_by_budget = LoopCounter(
            "llmso_closed_by_budget_total",
            "Requests whose JSON value or tool call the engine closed because max_tokens "
            "was near (finish 'stop', the value whole and valid).",
            hop,
            registry=registry,
        )

        self.shed_requests = LoopCounter(
            "llmso_shed_requests_total",
            "Requests answered 503 at once because this process served server.max_in_flight "
            "requests already or its event loop ran past server.shed_loop_lag_ms late, by "
            "API endpoint.",
            ("endpoint",),
            registry=registry,
        )
        self._shed: dict[str, Any] = {}
        self.loop_lag = LoopGauge(
            "llmso_event_loop_lag_seconds",
            "How late this process's event loop runs its timers (the median of the last 8 "
            "wakes, 25 ms apart); past server.shed_loop_lag_ms new requests are shed.",
            registry=registry,
        )

        # Per LoRA adapter (bounded: adapters are configured or registered by an admin).
        self.adapter_requests = LoopCounter(
            "llmso_adapter_requests_total",
            "Finished requests for a LoRA adapter, by base model, adapter and outcome.",
            ("model", "adapter", "status"),
            registry=registry,
        )
        self.adapter_generation_tokens = LoopCounter(
            "llmso_adapter_generation_tokens_total",
            "Tokens generated by a LoRA adapter.",
            ("model", "adapter"),
            registry=registry,
        )

    def shed(self, endpoint: str) -> None:
        """Count one request shed at the door (the in-flight ceiling or the loop's lag)."""
        child = self._shed.get(endpoint)
        if child is None:
            child = self._shed[endpoint] = self.shed_requests.labels(endpoint)
        child.inc()

    def adapter_finished(self, model: str, adapter: str, status: str, tokens: int) -> None:
        """Count one finished request for ``adapter`` of ``model``."""
        self.adapter_requests.labels(model, adapter, status).inc()
        self.adapter_generation_tokens.labels(model, adapter).inc(tokens)

    def finished(self, model: str, backend: str, status: str, endpoint: str) -> None:
        """Count one finished request (children cached: the label sets are bounded)."""
        key = (model, backend, status, endpoint)
        child = self._finished.get(key)
        if child is None:
            child = self._finished[key] = self.requests.labels(*key)
        child.inc()

    def series(self, model: str, backend: str) -> ModelSeries:
        key = (model, backend)
        found = self._series.get(key)
        if found is None:
            found = self._series[key] = ModelSeries(
                ttft=self.ttft.labels(model, backend),
                itl=self.itl.labels(model, backend),
                duration=self.duration.labels(model, backend),
                queue_time=self.queue_time.labels(model, backend),
                prompt_tokens=self.prompt_tokens.labels(model, backend),
                generation_tokens=self.generation_tokens.labels(model, backend),
                request_prompt_tokens=self.request_prompt_tokens.labels(model, backend),
                request_generation_tokens=self.request_generation_tokens.labels(model, backend),
                inflight=self.inflight.labels(model, backend),
                disconnects=self.disconnects.labels(model, backend),
                closed_by_budget=self.closed_by_budget.labels(model, backend),
                reasoning_tokens=self.reasoning_tokens.labels(model, backend),
            )
        return found
