"""Prometheus families for upstream replicas (``replicas:`` of the openai and triton backends).

Created once per app inside ``BackendMetrics`` and shared by every backend, so two models
never register the same family twice. The ``replica`` label is a configured base URL,
so its values are bounded by the config; ``reason`` and ``outcome`` are fixed sets.
There is no adapter label: adapter names come from the config and the admin API, and
the log line of each load names the adapter.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from backends.metric_types import LoopCounter, LoopGauge


class ReplicaMetrics:
    """The per-replica families; children are resolved once per replica (``Replica``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("model", "replica")
        self.requests = LoopCounter(
            "llmso_replica_requests_total",
            "Attempts sent to one replica, by outcome (ok or the error code).",
            (*labels, "outcome"),
            registry=registry,
        )
        self.routes = LoopCounter(
            "llmso_replica_routes_total",
            "Routing decisions, by balance policy and reason.",
            (*labels, "balance", "reason"),
            registry=registry,
        )
        self.inflight = LoopGauge(
            "llmso_replica_inflight_requests",
            "Requests this gateway has open on one replica.",
            labels,
            registry=registry,
        )
        self.up = LoopGauge(
            "llmso_replica_up",
            "1 when the replica passes health checks and is not ejected.",
            labels,
            registry=registry,
        )
        self.waiting = LoopGauge(
            "llmso_replica_queue_depth",
            "Requests waiting in the replica's engine (scraped from its /metrics).",
            labels,
            registry=registry,
        )
        self.running = LoopGauge(
            "llmso_replica_running_requests",
            "Requests running in the replica's engine (scraped from its /metrics).",
            labels,
            registry=registry,
        )
        self.kv_usage = LoopGauge(
            "llmso_replica_kv_cache_usage_ratio",
            "Fraction of the replica's KV cache in use (scraped from its /metrics).",
            labels,
            registry=registry,
        )
        self.resumes = LoopCounter(
            "llmso_stream_resumes_total",
            "Streams that broke after tokens reached the client, by outcome: resumed "
            "(continued on a replica), refused (the request cannot be rebuilt) or failed.",
            ("model", "outcome"),
            registry=registry,
        )
        self.resume_prompt_tokens = LoopCounter(
            "llmso_resume_prompt_tokens_total",
            "Prompt tokens sent again to continue broken streams: the gateway's cost, "
            "not billed to the client.",
            ("model",),
            registry=registry,
        )
        self.adapter_loads = LoopCounter(
            "llmso_adapter_loads_total",
            "LoRA adapter loads this gateway asked of one replica, by outcome (ok, "
            "rejected or the error code).",
            (*labels, "outcome"),
            registry=registry,
        )
        self.ejections = LoopCounter(
            "llmso_replica_ejections_total",
            "Times the replica was ejected after consecutive failures.",
            labels,
            registry=registry,
        )
