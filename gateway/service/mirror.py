"""Shadow traffic: copies of a share of a model's requests, sent to its shadow model in
the background (``mirror:`` on the model's config, docs/routing.md).

``Mirrors`` runs each copy as a task of its own with a ``RequestRecord`` of its own,
marked with the primary's request id, so the copy shows in the request log and the
shadow's metrics (endpoint ``mirror:<path>``) but never in the client's answer, its key's
limits or its usage. A copy's failure is counted and logged, nothing more. At most
``max_inflight`` copies of one model's requests run at once; one more is dropped and
counted. ``stop()`` cancels the copies still running.

Owned by the event loop: the completion service holds one and calls ``offer`` there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from backends.base import ApiError, GenerationRequest
from backends.hop_metrics import LATENCY_BUCKETS
from backends.metric_types import LoopCounter, LoopHistogram
from gateway.observe.record import RequestRecord

log = logging.getLogger(__name__)

SendShadow = Callable[[str, GenerationRequest, RequestRecord], Awaitable[None]]
"""Sends one copy to the named shadow model and reads its whole answer (observing it on
the record); raises what the model raised."""


class MirrorMetrics:
    """The mirror families on the app's registry; labels are config names and a fixed
    set of outcomes (``ok``, ``error``, ``dropped``, ``cancelled``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("model", "shadow")
        self.requests = LoopCounter(
            "llmso_mirror_requests_total",
            "Copies of a model's requests for its shadow, by outcome.",
            (*labels, "outcome"),
            registry=registry,
        )
        self.duration = LoopHistogram(
            "llmso_mirror_duration_seconds",
            "Time the shadow took to answer a copy in full (answered copies).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = LoopCounter(
            "llmso_mirror_prompt_tokens_total",
            "Prompt tokens of the copies the shadow answered.",
            labels,
            registry=registry,
        )
        self.generation_tokens = LoopCounter(
            "llmso_mirror_generation_tokens_total",
            "Tokens the shadow generated for the copies.",
            labels,
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class Copy:
    """One copy to send: ``request``, a copy of request ``primary_id`` that ``model`` took,
    to ``shadow``; ``endpoint`` and ``batch_id`` are the primary's."""

    model: str
    shadow: str
    request: GenerationRequest
    primary_id: str
    max_inflight: int
    endpoint: str = ""
    batch_id: str | None = None


class Mirrors:
    """The copies in flight, per primary model. Owned by the event loop (module doc)."""

    def __init__(self, send: SendShadow, metrics: MirrorMetrics) -> None:
        self._send = send
        self._metrics = metrics
        self._inflight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False

    def inflight(self, model: str) -> int:
        """Copies of ``model``'s requests running now."""
        return self._inflight.get(model, 0)

    def offer(self, copy: Copy) -> bool:
        """Start sending ``copy`` unless its model already has ``max_inflight`` copies
        running or the gateway is stopping (then it is dropped, and counted)."""
        running = self._inflight.get(copy.model, 0)
        if self._stopped or running >= copy.max_inflight:
            self._count(copy, "dropped")
            return False
        self._inflight[copy.model] = running + 1
        task = asyncio.create_task(self._run(copy), name=f"mirror:{copy.request.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def stop(self) -> None:
        """Cancel every copy still running and wait for them to end; later offers drop."""
        self._stopped = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, copy: Copy) -> None:
        record = RequestRecord(
            request_id=copy.request.request_id,
            requested_model=copy.shadow,
            endpoint=copy.endpoint,
            batch_id=copy.batch_id,
            mirror_of=copy.primary_id,
        )
        outcome = "error"
        try:
            await self._send(copy.shadow, copy.request, record)
            if record.status == "ok":
                outcome = "ok"
        except asyncio.CancelledError:
            outcome = "cancelled"
            record.fail("cancelled", None)
            raise
        except ApiError as exc:
            record.fail("error", exc.error_type)
            log.info("mirror %s to %s failed: %s", record.request_id, copy.shadow, exc.message)
        except Exception:  # a shadow's bug must never reach the primary
            record.fail("error", "server_error")
            log.exception("mirror %s to %s failed", record.request_id, copy.shadow)
        finally:
            self._inflight[copy.model] -= 1
            record.finish()
            self._count(copy, outcome)
            if outcome == "ok":
                self._observe(copy, record)

    def _count(self, copy: Copy, outcome: str) -> None:
        self._metrics.requests.labels(copy.model, copy.shadow, outcome).inc()

    def _observe(self, copy: Copy, record: RequestRecord) -> None:
        labels = (copy.model, copy.shadow)
        self._metrics.duration.labels(*labels).observe(record.elapsed)
        self._metrics.prompt_tokens.labels(*labels).inc(record.input_tokens)
        self._metrics.generation_tokens.labels(*labels).inc(record.output_tokens)
