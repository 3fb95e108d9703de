"""``build_app``: the one place an app and everything it owns is created.

No module-level state: tests build as many independent apps as they like, each with its
own Prometheus registry, model registry and backends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException

from backends.base import ApiError
from backends.factory import BackendFactory, create_backend
from backends.hop_metrics import BackendMetrics
from config.loader import ConfigError, load_config
from config.schema import AppConfig, workers_refusal
from gateway.access.admission import Admission
from gateway.access.store import Store
from gateway.api.base import Endpoint
from gateway.api.chat import ChatEndpoint
from gateway.api.completions import CompletionsEndpoint
from gateway.api.embeddings import EmbeddingsEndpoint
from gateway.api.messages.endpoint import CountTokensEndpoint, MessagesEndpoint
from gateway.api.rerank import scoring_endpoints
from gateway.api.responses import api as responses_api
from gateway.api.responses.endpoint import ResponsesEndpoint
from gateway.api.responses.store import ResponseStore
from gateway.api.responses.stores import open_store
from gateway.api.thought_seal import ThoughtSeal
from gateway.api.tokenize import tokenize_endpoints
from gateway.batch import routes as batch_routes
from gateway.batch.files import FileStore
from gateway.batch.runner import BatchRunner
from gateway.batch.store import BatchState
from gateway.console import Console
from gateway.edge import adapters as adapter_routes
from gateway.edge import console_routes, ops
from gateway.edge.admin_actions import replay
from gateway.edge.asgi import GatewayASGI
from gateway.edge.door import FrontDoor
from gateway.edge.openapi import document
from gateway.edge.state import AppState
from gateway.edge.views import serve_fleet
from gateway.errors import handle_backend_error, handle_http_exception, handle_unexpected
from gateway.fleet.link import FleetLink
from gateway.fleet.stores import HubLimits, HubResponses
from gateway.observe.loop_lag import LoopLag
from gateway.observe.metrics import GatewayMetrics
from gateway.registry import ConfigWatcher, ModelRegistry, RegistryMetrics
from gateway.service.embeddings import EmbeddingService
from gateway.service.generation import CompletionService
from gateway.service.mirror import MirrorMetrics
from gateway.service.scoring import ScoreService
from gateway.service.tokenizing import TokenizeService

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from gateway.observe.tracing import Tracing

log = logging.getLogger(__name__)


def build_app(
    config: AppConfig,
    *,
    admin_key: str | None = None,
    backend_factory: BackendFactory | None = None,
    watch_config: bool = False,
    span_exporter: SpanExporter | None = None,
    bind_host: str | None = None,
    fleet: FleetLink | None = None,
) -> GatewayASGI:
    """Create the app. ``backend_factory`` replaces real backends in service tests;
    ``span_exporter`` turns tracing on with that exporter (tests: the in-memory one);
    ``fleet``: this app is a worker of ``llmso serve --workers N`` (its hub link)."""
    prometheus = CollectorRegistry()
    backend_metrics = BackendMetrics(prometheus)
    factory = backend_factory or (
        lambda model, on_crash: create_backend(model, backend_metrics, on_crash)
    )
    registry = ModelRegistry(config, RegistryMetrics(prometheus), factory)
    gateway_metrics = GatewayMetrics(prometheus)
    lag = LoopLag(_seconds(config.server.shed_loop_lag_ms), observe=gateway_metrics.loop_lag.set)
    service = CompletionService(
        registry, gateway_metrics, backend_metrics, MirrorMetrics(prometheus)
    )
    admission = Admission(
        config, registry, gateway_metrics, prometheus, store=_fleet_limits(config, fleet)
    )
    seal = ThoughtSeal(
        config.server.reasoning_secret or (fleet.seat.seal_secret if fleet is not None else None)
    )
    state = AppState(
        config=config,
        prometheus=prometheus,
        gateway_metrics=gateway_metrics,
        backend_metrics=backend_metrics,
        registry=registry,
        service=service,
        responses=ResponsesEndpoint(service, _responses_store(config, fleet), seal),
        admin_key=admin_key,
        started_at=int(time.time()),
        console=Console(backend_metrics),
        tracing=_tracing(config, span_exporter),
        admission=admission,
        door=FrontDoor(
            config.server,
            admission,
            bind_host=bind_host,
            metrics=gateway_metrics,
            worker=None if fleet is None else fleet.seat.worker,
            lag=lag,
        ),
        fleet=fleet,
    )
    admission.finish_sinks.append(state.console.activity.add)
    endpoints = _endpoints(state, seal)
    batch_state = BatchState(config.batch.directory)
    batch_runner = BatchRunner(
        config=config.batch,
        state=batch_state,
        files=FileStore(config.batch.directory, batch_state, config.batch.max_file_bytes),
        endpoints={endpoint.path: endpoint for endpoint in endpoints},
        admission=admission,
        registry=registry,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        watcher = None
        actions = await _join(fleet, state)
        # Preloads run in the background: /health answers at once, /ready once they are up.
        await registry.start(wait=False)
        await replay(registry, actions)  # what the fleet's admins did before this worker
        if watch_config and config.source_path is not None:
            watcher = ConfigWatcher(
                registry,
                config.source_path,
                on_reload=admission.reconfigure,
                loader=_loader(fleet),
            )
            watcher.start()
        batch_runner.start()
        lag_task = asyncio.create_task(lag.run(), name="llmso-loop-lag")
        log.info("llmso ready: %d model(s) configured", len(config.models))
        try:
            yield
        finally:
            lag_task.cancel()
            await batch_runner.stop()
            if watcher is not None:
                await watcher.stop()
            await service.stop()  # mirror copies: cancelled, not drained
            await registry.stop()
            await state.responses.store.close()
            if state.tracing is not None:
                # Flushes what is still queued; off the loop, export may block.
                await asyncio.to_thread(state.tracing.shutdown)
            await admission.close()
            if fleet is not None:
                await fleet.close()

    app = FastAPI(
        title="llmso",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.llmso = state
    app.state.batch_runner = batch_runner
    _operational_routes(app, config)
    asgi = GatewayASGI(app, state, endpoints)
    document(app, asgi.documented)
    return asgi


def _operational_routes(app: FastAPI, config: AppConfig) -> None:
    """The routes FastAPI serves (everything but the public endpoints), and its error
    handlers."""
    app.include_router(ops.router)
    app.include_router(adapter_routes.router)
    app.include_router(console_routes.build_router(ui=config.server.ui))
    app.include_router(responses_api.router)
    app.include_router(batch_routes.router)
    app.add_exception_handler(ApiError, handle_backend_error)
    app.add_exception_handler(StarletteHTTPException, handle_http_exception)
    app.add_exception_handler(Exception, handle_unexpected)


def _endpoints(state: AppState, seal: ThoughtSeal) -> tuple[Endpoint, ...]:
    """The public endpoints (gateway.api): one line each."""
    service, registry, metrics = state.service, state.registry, state.gateway_metrics
    return (
        ChatEndpoint(service),
        CompletionsEndpoint(service),
        EmbeddingsEndpoint(EmbeddingService(registry, metrics)),
        state.responses,
        MessagesEndpoint(service, seal),
        CountTokensEndpoint(service, seal),
        *scoring_endpoints(ScoreService(registry, metrics)),
        *tokenize_endpoints(TokenizeService(registry, metrics)),
    )


async def _join(fleet: FleetLink | None, state: AppState) -> list[Any]:
    """A fleet's worker joins its hub, ready to answer its calls; returns the admin
    actions to replay (none outside a fleet)."""
    if fleet is None:
        return []
    serve_fleet(fleet, state)
    return await fleet.connect()


def _fleet_limits(config: AppConfig, fleet: FleetLink | None) -> Store | None:
    """A worker's limit store when the fleet's hub serves it (``limits.store: memory``):
    one count for every worker, as Redis gives every replica."""
    if fleet is None or config.limits.store != "memory":
        return None
    return HubLimits(fleet)


def _responses_store(config: AppConfig, fleet: FleetLink | None) -> ResponseStore:
    """The configured Responses store; the hub's for a fleet's worker where that is
    ``memory`` (a follow-up may land on any worker)."""
    if fleet is not None and (config.responses.store or config.limits.store) == "memory":
        return HubResponses(fleet, config.responses.timeout)
    return open_store(config.responses, default=config.limits.store)


def _loader(fleet: FleetLink | None) -> Callable[[Path], AppConfig]:
    """How a reload reads the config: a fleet's worker also refuses what the fleet cannot
    serve (an hf model), keeping the config it has."""
    if fleet is None:
        return load_config
    workers = fleet.seat.workers

    def load(path: Path) -> AppConfig:
        config = load_config(path)
        refusal = workers_refusal(config, workers)
        if refusal is not None:
            raise ConfigError(f"{path}: {refusal}")
        return config

    return load


def _tracing(config: AppConfig, exporter: SpanExporter | None) -> Tracing | None:
    """The app's tracer provider, or ``None`` when off (the SDK is then never imported)."""
    if not config.tracing.enabled and exporter is None:
        return None
    from gateway.observe.tracing import Tracing

    return Tracing(config.tracing, exporter)


def _seconds(milliseconds: float | None) -> float | None:
    return None if milliseconds is None else milliseconds / 1000
