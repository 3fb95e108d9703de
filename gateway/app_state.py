"""What one app instance owns: built by ``build_app``, torn down by its lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from backends.hop_metrics import BackendMetrics
from config.schema import AppConfig
from gateway.registry import ModelRegistry
from gateway.request_metrics import GatewayMetrics
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

    @property
    def max_body_bytes(self) -> int:
        return self.config.server.max_body_bytes
