"""``build_app``: the one place an app and everything it owns is created.

No module-level state: tests build as many independent apps as they like, each with its
own Prometheus registry, model registry and backends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from backends.base import ApiError
from backends.factory import BackendFactory, create_backend
from backends.hop_metrics import BackendMetrics
from config.schema import AppConfig
from gateway import ops_routes
from gateway.app_state import AppState
from gateway.errors import handle_backend_error, handle_http_exception, handle_unexpected
from gateway.registry import ConfigWatcher, ModelRegistry, RegistryMetrics
from gateway.request_metrics import GatewayMetrics
from gateway.routes import GatewayASGI
from gateway.service import CompletionService

log = logging.getLogger(__name__)


def build_app(
    config: AppConfig,
    *,
    admin_key: str | None = None,
    backend_factory: BackendFactory | None = None,
    watch_config: bool = False,
) -> GatewayASGI:
    """Create the app. ``backend_factory`` replaces real backends in service tests."""
    prometheus = CollectorRegistry()
    backend_metrics = BackendMetrics(prometheus)
    factory = backend_factory or (
        lambda model, on_crash: create_backend(model, backend_metrics, on_crash)
    )
    registry = ModelRegistry(config, RegistryMetrics(prometheus), factory)
    gateway_metrics = GatewayMetrics(prometheus)
    state = AppState(
        config=config,
        prometheus=prometheus,
        gateway_metrics=gateway_metrics,
        backend_metrics=backend_metrics,
        registry=registry,
        service=CompletionService(registry, gateway_metrics, backend_metrics),
        admin_key=admin_key,
        started_at=int(time.time()),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = None
        # Preloads run in the background: /health answers at once, /ready once they are up.
        await registry.start(wait=False)
        if watch_config and config.source_path is not None:
            watcher = ConfigWatcher(registry, config.source_path)
            watcher.start()
        log.info("llmso ready: %d model(s) configured", len(config.models))
        try:
            yield
        finally:
            if watcher is not None:
                await watcher.stop()
            await registry.stop()

    app = FastAPI(
        title="llmso",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.llmso = state
    app.include_router(ops_routes.router)
    app.add_exception_handler(ApiError, handle_backend_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_exception)
    app.add_exception_handler(Exception, handle_unexpected)
    return GatewayASGI(app, state)
