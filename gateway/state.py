"""What one app instance owns: built by ``build_app``, torn down by its lifespan."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from backends.metrics import BackendMetrics
from config.schema import AppConfig
from gateway.drain import Drain
from gateway.metrics import GatewayMetrics
from gateway.registry import ModelRegistry
from gateway.service import CompletionService


@dataclass(slots=True)
class AppState:
    """Owned by the event loop of the app it belongs to."""

    config: AppConfig
    prometheus: CollectorRegistry
    gateway_metrics: GatewayMetrics
    backend_metrics: BackendMetrics
    registry: ModelRegistry
    service: CompletionService
    admin_key: str | None
    started_at: int
    drain: Drain = field(default_factory=Drain)

    @property
    def max_body_bytes(self) -> int:
        return self.config.server.max_body_bytes
