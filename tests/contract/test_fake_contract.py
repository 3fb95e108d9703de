"""The contract suite on the test ``FakeBackend``, in process and in a worker process
(``ProcessBackend``), so the suite itself is checked on every run in a second or two. The
fakes split a ``qwen3`` thought (the worker carries it across its protocol); a plain one
has no parser, so its reasoning controls are dropped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.base import Backend, GenerationRequest
from backends.hop_metrics import BackendMetrics
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig
from tests.contract.backend_suite import BackendContract
from tests.tools.fake_backend import FakeBackend

FAKE = "tests.tools.fake_backend:FakeBackend"


def _config(**overrides: Any) -> HFModelConfig:
    fields = {
        "name": "contract",
        "backend": "hf",
        "source": "unused",
        "isolation": "process",
        "reasoning_parser": "qwen3",
    }
    return HFModelConfig(**{**fields, **overrides})


class _FakeRequests(BackendContract):
    # The fake echoes the prompt's words: a long prompt makes a long answer.
    prompt = " ".join(f"word{i}" for i in range(40))
    long_tokens = 40

    def thinking_request(self) -> GenerationRequest:
        request = self.request(16)
        from backends.base import ChatMessage

        message = ChatMessage("user", "<think> first I ponder </think> then I answer")
        return replace(request, messages=(message,))

    def invalid_request(self) -> GenerationRequest:
        request = self.request(4)
        from backends.base import ChatMessage

        message = ChatMessage("user", "!error InvalidRequest temperature out of range")
        return GenerationRequest(
            request_id=request.request_id,
            model=request.model,
            kind=request.kind,
            sampling=request.sampling,
            messages=(message,),
        )


class TestFakeContract(_FakeRequests):
    @pytest.fixture
    async def backend(self) -> AsyncIterator[FakeBackend]:
        fake = FakeBackend(_config(), delay=0.005)
        await fake.start()
        yield fake
        await fake.stop()

    @pytest.fixture
    def unstarted(self) -> FakeBackend:
        return FakeBackend(_config())

    @pytest.fixture(scope="class")
    async def spare(self) -> AsyncIterator[FakeBackend]:
        fake = FakeBackend(_config(), delay=0.005, max_running=2)
        await fake.start()
        yield fake
        await fake.stop()

    async def aborted(self, backend: Backend) -> float:
        assert isinstance(backend, FakeBackend)
        return backend.aborted


class TestPlainFakeContract(_FakeRequests):
    """A model without a reasoning parser: no thought, controls dropped."""

    def thinking_request(self) -> None:
        return None

    @pytest.fixture
    async def backend(self) -> AsyncIterator[FakeBackend]:
        fake = FakeBackend(_config(reasoning_parser=None), delay=0.005)
        await fake.start()
        yield fake
        await fake.stop()

    @pytest.fixture
    def unstarted(self) -> FakeBackend:
        return FakeBackend(_config(reasoning_parser=None))

    @pytest.fixture(scope="class")
    async def spare(self) -> AsyncIterator[FakeBackend]:
        fake = FakeBackend(_config(reasoning_parser=None), delay=0.005, max_running=2)
        await fake.start()
        yield fake
        await fake.stop()

    async def aborted(self, backend: Backend) -> float:
        assert isinstance(backend, FakeBackend)
        return backend.aborted


class TestFakeInWorkerContract(_FakeRequests):
    """The same fake behind the process IPC: events, errors and aborts cross it."""

    registry = CollectorRegistry()
    metrics = BackendMetrics(registry)  # one set of families per registry

    def _worker(self, **env: str) -> ProcessBackend:
        return ProcessBackend(
            _config(),
            self.metrics,
            backend_factory=FAKE,
            env={"LLMSO_FAKE_DELAY": "0.005", **env},
        )

    @pytest.fixture(scope="class")
    async def backend(self) -> AsyncIterator[ProcessBackend]:
        worker = self._worker()
        await worker.start()
        yield worker
        await worker.stop()

    @pytest.fixture
    def unstarted(self) -> ProcessBackend:
        return self._worker()

    @pytest.fixture(scope="class")
    async def spare(self) -> AsyncIterator[ProcessBackend]:
        worker = self._worker(LLMSO_FAKE_MAX_RUNNING="2")
        await worker.start()
        yield worker
        await worker.stop()

    async def aborted(self, backend: Backend) -> float:
        value = self.registry.get_sample_value(
            "llmso_worker_aborted_requests_total", {"model": "contract"}
        )
        return value or 0.0
