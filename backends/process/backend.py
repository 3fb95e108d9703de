"""``ProcessBackend``: an ``hf`` model whose engine runs in its own worker process.

A crash in the engine (a segfault, an OOM kill, ``kill -9``) then takes down one worker
instead of the gateway. The parent keeps the ``Backend`` contract: ``generate`` relays
events from the worker, closing the iterator cancels the request in the worker, and a
``BackendError`` raised there is raised here with the same class and fields.

Lifecycle: ``start()`` spawns a worker and waits up to ``config.load_timeout`` for it to
load; ``stop()`` terminates it (SIGTERM, then SIGKILL). If the worker dies on its own,
every in-flight request ends with ``BackendCrashed``, ``ready()`` turns False and
``on_crash(reason)`` is called on the event loop; ``start()`` may then be called again.
An embedding model (``task: embed``) works the same way through ``embed``, and every
model through ``score``, ``tokenize`` and ``detokenize`` where its engine declares them:
each call travels to the worker as one message (``protocol.ASK``) and its answer comes
back as one; cancelling it cancels the engine's wait there.

Ownership: all state belongs to the event loop that called ``start()``; ``start`` and
``stop`` are serialised by a lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TypeVar

from backends.base import (
    TEXT_GENERATION,
    AdapterSpec,
    BackendError,
    BackendEvent,
    Feature,
    GenerationRequest,
    ModelInfo,
    NotReady,
    UpstreamBadResponse,
)
from backends.embeddings import EmbeddingRequest, EmbeddingResult
from backends.hop_metrics import BackendMetrics
from backends.process.connection import End, WorkerProcess
from backends.scoring import ScoreRequest, ScoreResult
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult
from config.schema import AdapterConfig, HFModelConfig

log = logging.getLogger(__name__)
# Registering an adapter reads its folder and stacks it into a bank once, in the worker.
_ADAPTER_CALL_S = 120.0
# Tokenizing runs no model: an answer later than this means a stuck worker.
_TOKENIZE_CALL_S = 30.0
# What each task declares before a worker said so itself (hf: backends.factory).
_DECLARED = {
    "embed": frozenset({Feature.EMBEDDINGS, Feature.SCORE, Feature.TOKENIZE}),
    "score": frozenset({Feature.SCORE, Feature.TOKENIZE}),
    "generate": TEXT_GENERATION | {Feature.TOKENIZE},
}
T = TypeVar("T")

DEFAULT_FACTORY = "backends.factory:in_process_hf"
FACTORY_ENV = "LLMSO_WORKER_BACKEND"
"""Overrides the engine class built in the worker (``module:Class``); a test seam."""


class ProcessBackend:
    """The ``Backend`` for ``isolation: process``; see the module docstring.

    ``backend_factory`` (``module:Class``, called in the worker as ``Class(config,
    observer, on_crash)``) defaults to ``$LLMSO_WORKER_BACKEND`` or the in-process
    ``hf`` engine (``backends.factory.in_process_hf``). ``env`` is added to the worker's
    environment. ``stop_timeout`` is how long the worker may take to exit after SIGTERM;
    ``ready_timeout`` bounds ``ready()``.
    """

    def __init__(
        self,
        config: HFModelConfig,
        metrics: BackendMetrics,
        on_crash: Callable[[str], None] | None = None,
        *,
        backend_factory: str | None = None,
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 10.0,
        ready_timeout: float = 5.0,
    ) -> None:
        self._config = config
        self._added: dict[str, AdapterSpec] = {}  # adapters registered at run time
        self._observer = metrics.observer(config.name)
        self._on_crash = on_crash
        self._factory = backend_factory or os.environ.get(FACTORY_ENV) or DEFAULT_FACTORY
        self._env = dict(env or {})
        self._stop_timeout = stop_timeout
        self._ready_timeout = ready_timeout
        self._worker: WorkerProcess | None = None
        self._info: ModelInfo | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The live worker's pid, or ``None`` when no worker runs."""
        worker = self._worker
        return worker.pid if worker is not None and worker.alive else None

    async def start(self) -> None:
        """Spawn the worker and wait until its engine loaded; a no-op if it runs.

        Raises ``WorkerStartError`` if the engine fails to load, the worker dies while
        loading, or ``config.load_timeout`` passes; the worker is gone afterwards.
        """
        async with self._lock:
            if self._worker is not None and self._worker.alive:
                return
            worker = WorkerProcess(self._config.name, self._observer, self._worker_lost)
            self._worker = worker
            try:
                await worker.spawn(self._spawn_config(), self._factory, self._env)
                self._info = await worker.wait_ready(self._config.load_timeout)
            except BaseException:
                self._worker = None
                await worker.terminate(self._stop_timeout, "failed to start")
                raise
            log.info("model %s: worker pid %s ready", self._config.name, worker.pid)

    async def stop(self) -> None:
        """Terminate the worker; in-flight streams end with ``BackendCrashed``."""
        async with self._lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                await worker.terminate(self._stop_timeout, "stopped")

    async def ready(self) -> bool:
        worker = self._worker
        if worker is None or not worker.is_ready:
            return False
        try:
            return await worker.call("ready", self._ready_timeout) is True
        except (TimeoutError, BackendError):
            return False

    async def add_adapter(self, adapter: AdapterSpec) -> None:
        await self._call("add_adapter", adapter)
        self._added[adapter.name] = adapter

    async def remove_adapter(self, name: str) -> None:
        await self._call("remove_adapter", name)
        self._added.pop(name, None)

    async def _call(self, name: str, arg: object) -> None:
        worker = self._worker
        if worker is None or not worker.is_ready:
            raise NotReady(f"model {self._config.name!r} is not loaded", retry_after=1.0)
        try:
            await worker.call(name, _ADAPTER_CALL_S, arg)
        except TimeoutError:
            raise NotReady(
                f"model {self._config.name!r}: the worker did not answer {name}", retry_after=1.0
            ) from None

    def _spawn_config(self) -> HFModelConfig:
        """The config a worker starts with: adapters registered at run time included, so
        a respawned worker serves them too."""
        if not self._added:
            return self._config
        extra = tuple(
            AdapterConfig(name=a.name, source=a.source or "", aliases=a.aliases)
            for a in self._added.values()
        )
        return self._config.model_copy(update={"adapters": self._config.adapters + extra})

    def info(self) -> ModelInfo:
        worker = self._worker
        if self._info is not None and worker is not None and worker.is_ready:
            return self._info
        # Between workers (restart), keep declaring what the last one served.
        return ModelInfo(
            max_context=self._config.max_context,
            memory_bytes=self._config.memory_bytes,
            extra={"isolation": "process"},
            features=self._info.features if self._info is not None else self._declared(),
        )

    def _declared(self) -> frozenset[Feature]:
        """What the model serves before any worker told us (the config's ``task``)."""
        return _DECLARED[self._config.task]

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        """``Embedder.embed`` in the worker; only reached when it declared embeddings."""
        # The engine enforces request.timeout itself; the margin only catches a stuck worker.
        limit = request.timeout + self._stop_timeout
        return await self._ask("embed", request, limit, EmbeddingResult)

    async def score(self, request: ScoreRequest) -> ScoreResult:
        """``Scorer.score`` in the worker; only reached when it declared scoring."""
        limit = request.timeout + self._stop_timeout
        return await self._ask("score", request, limit, ScoreResult)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return await self._ask("tokenize", request, _TOKENIZE_CALL_S, TokenizeResult)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        return await self._ask("detokenize", request, _TOKENIZE_CALL_S, str)

    async def _ask(self, method: str, request: object, limit_s: float, kind: type[T]) -> T:
        worker = self._worker
        if worker is None or not worker.is_ready:
            raise NotReady(f"model {self._config.name!r} is not loaded")
        answer = await worker.ask(method, request, limit_s)
        if not isinstance(answer, kind):
            raise UpstreamBadResponse(f"the worker answered {method} with {type(answer).__name__}")
        return answer

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        worker = self._worker
        if worker is None or not worker.is_ready:
            raise NotReady(f"model {self._config.name!r} is not loaded")
        key, stream = worker.open(request)
        ended = False
        try:
            while True:
                for item in await stream.take():
                    if isinstance(item, End):
                        ended = True
                        return
                    if isinstance(item, BackendError):
                        ended = True
                        raise item
                    yield item
        finally:
            # Early close (client left) or cancellation: abort the request in the worker.
            worker.close_stream(key, cancel=not ended)

    def _worker_lost(self, worker: WorkerProcess, reason: str) -> None:
        """Called by the worker handle on the loop when its process died on its own."""
        if worker is not self._worker or not worker.was_ready:
            return  # a stopped worker, or one still loading: start() raises instead
        log.error("model %s: worker crashed: %s", self._config.name, reason)
        if self._on_crash is not None:
            asyncio.get_running_loop().call_soon(self._on_crash, reason)
