"""Prometheus families for the backend and worker hops, built on the app's registry.

The gateway owns the ``CollectorRegistry`` and creates one ``BackendMetrics`` per app;
every backend receives it. Labels stay bounded: model, backend, status (never a
request id or user). Engines do not touch Prometheus directly: they report through a
``WorkerObserver`` so that an engine running in a worker process can forward the same
observations over its IPC channel.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry

from backends.metric_types import Counter, Gauge, Histogram, LoopCounter, LoopGauge, LoopHistogram
from backends.replicas.metrics import ReplicaMetrics

# Token-level latencies on CPU run from ~5 ms to seconds; requests up to minutes.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
    163.84,
)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256)


class WorkerObserver(Protocol):
    """What an engine reports about its own loop. Called from the engine's thread."""

    def on_step(self, batch_size: int, num_tokens: int, seconds: float) -> None: ...

    def on_load(self, running: int, waiting: int, kv_cache_usage: float) -> None: ...

    def on_abort(self) -> None: ...

    def on_preempt(self) -> None: ...

    def on_step_error(self) -> None:
        """A step raised and failed its requests; the engine goes on."""

    def on_newcomer_step(self) -> None:
        """A step ran only the prompts of keys that held no slot, the decoding rows sat
        it out (``backends.hf.engine.scheduler``)."""

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        """One admitted prompt: its length and how many tokens the prefix cache supplied."""
        ...


class BackendMetrics:
    """All backend- and worker-hop families. Created once per app, shared by backends."""

    def __init__(self, registry: CollectorRegistry) -> None:
        worker = ("model",)
        hop = ("model", "backend")
        self.worker_batch_size = Histogram(
            "llmso_worker_batch_size",
            "Sequences in one engine step.",
            worker,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.worker_step_seconds = Histogram(
            "llmso_worker_step_duration_seconds",
            "Wall time of one engine step.",
            worker,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.worker_step_tokens = Histogram(
            "llmso_worker_step_tokens",
            "Tokens processed in one engine step.",
            worker,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.worker_queue_depth = Gauge(
            "llmso_worker_queue_depth",
            "Requests waiting for the engine.",
            worker,
            registry=registry,
        )
        self.worker_running = Gauge(
            "llmso_worker_running_requests",
            "Requests being decoded.",
            worker,
            registry=registry,
        )
        self.worker_kv_cache_usage = Gauge(
            "llmso_worker_kv_cache_usage_ratio",
            "Fraction of the KV cache in use.",
            worker,
            registry=registry,
        )
        self.worker_aborted = Counter(
            "llmso_worker_aborted_requests_total",
            "Requests dropped because the client left.",
            worker,
            registry=registry,
        )
        self.worker_step_errors = Counter(
            "llmso_worker_step_errors_total",
            "Engine steps that raised (their requests failed; the engine went on).",
            worker,
            registry=registry,
        )
        self.worker_newcomer_steps = Counter(
            "llmso_worker_newcomer_steps_total",
            "Steps that prefilled only the requests of keys holding no slot, the decoding "
            "rows sitting them out (hf newcomer steps).",
            worker,
            registry=registry,
        )
        self.worker_preempted = Counter(
            "llmso_worker_preempted_requests_total",
            "Requests preempted for lack of cache.",
            worker,
            registry=registry,
        )
        self.worker_prefix_queried = Counter(
            "llmso_worker_prefix_cache_queried_tokens_total",
            "Prompt tokens looked up in the prefix cache.",
            worker,
            registry=registry,
        )
        self.worker_prefix_hit = Counter(
            "llmso_worker_prefix_cache_hit_tokens_total",
            "Prompt tokens served from the prefix cache (no prefill).",
            worker,
            registry=registry,
        )
        self.worker_prefix_ratio = Gauge(
            "llmso_worker_prefix_cache_hit_ratio",
            "Hit tokens / queried tokens of the prefix cache since the engine started.",
            worker,
            registry=registry,
        )
        self.upstream_requests = LoopCounter(
            "llmso_upstream_requests_total",
            "Requests sent to an upstream server.",
            (*hop, "status"),
            registry=registry,
        )
        self.upstream_latency = LoopHistogram(
            "llmso_upstream_latency_seconds",
            "Upstream time from send to last byte.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_ttft = LoopHistogram(
            "llmso_upstream_time_to_first_token_seconds",
            "Upstream time to first token.",
            hop,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.upstream_up = LoopGauge(
            "llmso_upstream_up",
            "1 when the upstream passes health checks.",
            hop,
            registry=registry,
        )
        self.overhead = LoopHistogram(
            "llmso_overhead_seconds",
            "Gateway time minus time waiting on the upstream.",
            hop,
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.replicas = ReplicaMetrics(registry)

    def observer(self, model: str) -> WorkerObserver:
        return PrometheusWorkerObserver(self, model)


class PrometheusWorkerObserver:
    """Writes an engine's observations into the app's families for one model."""

    def __init__(self, metrics: BackendMetrics, model: str) -> None:
        self._batch = metrics.worker_batch_size.labels(model)
        self._step = metrics.worker_step_seconds.labels(model)
        self._tokens = metrics.worker_step_tokens.labels(model)
        self._waiting = metrics.worker_queue_depth.labels(model)
        self._running = metrics.worker_running.labels(model)
        self._kv = metrics.worker_kv_cache_usage.labels(model)
        self._aborted = metrics.worker_aborted.labels(model)
        self._preempted = metrics.worker_preempted.labels(model)
        self._step_errors = metrics.worker_step_errors.labels(model)
        self._newcomer_steps = metrics.worker_newcomer_steps.labels(model)
        self._prefix_queried = metrics.worker_prefix_queried.labels(model)
        self._prefix_hit = metrics.worker_prefix_hit.labels(model)
        self._prefix_ratio = metrics.worker_prefix_ratio.labels(model)
        self._queried_total = 0
        self._hit_total = 0

    def on_step(self, batch_size: int, num_tokens: int, seconds: float) -> None:
        self._batch.observe(batch_size)
        self._tokens.observe(num_tokens)
        self._step.observe(seconds)

    def on_load(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        self._running.set(running)
        self._waiting.set(waiting)
        self._kv.set(kv_cache_usage)

    def on_abort(self) -> None:
        self._aborted.inc()

    def on_preempt(self) -> None:
        self._preempted.inc()

    def on_step_error(self) -> None:
        self._step_errors.inc()

    def on_newcomer_step(self) -> None:
        self._newcomer_steps.inc()

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        self._prefix_queried.inc(queried_tokens)
        self._prefix_hit.inc(hit_tokens)
        self._queried_total += queried_tokens
        self._hit_total += hit_tokens
        if self._queried_total:
            self._prefix_ratio.set(self._hit_total / self._queried_total)
