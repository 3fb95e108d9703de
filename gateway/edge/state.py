"""What one app instance owns: built by ``build_app``, torn down by its lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from backends.hop_metrics import BackendMetrics
from config.schema import AppConfig
from gateway.access.admission import Admission
from gateway.api.responses.endpoint import ResponsesEndpoint
from gateway.console import Console
from gateway.edge.door import FrontDoor
from gateway.edge.drain import Drain
from gateway.fleet.link import FleetLink
from gateway.observe.metrics import GatewayMetrics
from gateway.registry import ModelRegistry
from gateway.service.generation import CompletionService

if TYPE_CHECKING:
    from gateway.observe.tracing import Tracing


@dataclass(slots=True)
class AppState:
    """Owned by the event loop of the app it belongs to."""

    config: AppConfig
    prometheus: CollectorRegistry
    gateway_metrics: GatewayMetrics
    backend_metrics: BackendMetrics
    registry: ModelRegistry
    service: CompletionService
    responses: ResponsesEndpoint
    admin_key: str | None
    started_at: int
    console: Console
    admission: Admission  # client keys, limits, usage
    door: FrontDoor  # the HTTP checks in front of every request
    drain: Drain = field(default_factory=Drain)
    tracing: Tracing | None = None  # None: tracing off (gateway.observe.tracing is never imported)
    fleet: FleetLink | None = None  # a worker of `llmso serve --workers N`: its hub link

    @property
    def max_body_bytes(self) -> int:
        return self.config.server.max_body_bytes
