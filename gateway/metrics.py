"""Gateway-hop Prometheus families, on a registry owned by one app (never the global one).

Labels are bounded: model, backend, status. Histograms use base units (seconds, tokens).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from backends.metrics import LATENCY_BUCKETS

TOKEN_BUCKETS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class GatewayMetrics:
    """Families observed once per request (and per token for inter-token latency)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        hop = ("model", "backend")
        self.requests = Counter(
            "llmso_requests_total",
            "Finished requests by outcome.",
            (*hop, "status"),
            registry=registry,
        )
        self.duration = Histogram(
            "llmso_request_duration_seconds",
            "End-to-end request latency at the gateway.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "llmso_time_to_first_token_seconds",
            "Arrival to first generated text.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.itl = Histogram(
            "llmso_inter_token_latency_seconds",
            "Gap between consecutive text deltas.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_time = Histogram(
            "llmso_queue_time_seconds",
            "Time waiting before inference started.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "llmso_prompt_tokens_total",
            "Prompt tokens processed.",
            hop,
            registry=registry,
        )
        self.generation_tokens = Counter(
            "llmso_generation_tokens_total",
            "Tokens generated.",
            hop,
            registry=registry,
        )
        self.request_prompt_tokens = Histogram(
            "llmso_request_prompt_tokens",
            "Prompt tokens per request.",
            hop,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.request_generation_tokens = Histogram(
            "llmso_request_generation_tokens",
            "Generated tokens per request.",
            hop,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.inflight = Gauge(
            "llmso_inflight_requests",
            "Requests being served.",
            hop,
            registry=registry,
        )
        self.disconnects = Counter(
            "llmso_client_disconnects_total",
            "Requests whose client left before the end.",
            hop,
            registry=registry,
        )
