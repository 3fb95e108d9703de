"""ProcessBackend with the FakeBackend in a real worker process: relay, errors,
cancellation, crash detection, restart, shutdown and start-up failures."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from backends import base
from backends.base import (
    BackendCrashed,
    BackendError,
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    NotReady,
    RequestKind,
    SamplingParams,
    Started,
    TextDelta,
    Usage,
)
from backends.errors import WorkerStartError
from backends.hop_metrics import BackendMetrics
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig
from tests.tools.fake_backend import FakeBackend

FAKE = "tests.tools.fake_backend:FakeBackend"
ROOT = Path(__file__).resolve().parents[2]


def _config(name: str = "fake", load_timeout: float = 30.0) -> HFModelConfig:
    return HFModelConfig(
        name=name, backend="hf", source="unused", isolation="process", load_timeout=load_timeout
    )


def _request(prompt: str, max_tokens: int = 100, n: int = 1) -> GenerationRequest:
    return GenerationRequest(
        request_id="req",
        model="fake",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=max_tokens, n=n),
        prompt=prompt,
    )


def _sample(metrics_registry: CollectorRegistry, name: str, model: str = "fake") -> float:
    value = metrics_registry.get_sample_value(name, {"model": model})
    return 0.0 if value is None else value


def _pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer exists (or is a zombie nobody reaped yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return "\nState:\tZ" in status


async def _wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def _collect(events: AsyncIterator[BackendEvent]) -> list[BackendEvent]:
    return [event async for event in events]


def _comparable(events: list[BackendEvent]) -> list[BackendEvent]:
    return [e for e in events if not isinstance(e, Started)]


class Harness:
    def __init__(self, factory: str = FAKE, **kwargs: object) -> None:
        self.registry = CollectorRegistry()
        self.crashes: list[str] = []
        self.backend = ProcessBackend(
            _config(),
            BackendMetrics(self.registry),
            on_crash=self.crashes.append,
            backend_factory=factory,
            **kwargs,  # type: ignore[arg-type]
        )


@pytest_asyncio.fixture(scope="module")
async def shared() -> AsyncIterator[Harness]:
    """One worker for the tests that leave it healthy (tokens 20 ms apart)."""
    harness = Harness(env={"LLMSO_FAKE_DELAY": "0.02"})
    await harness.backend.start()
    yield harness
    await harness.backend.stop()


# --------------------------------------------------------------------------- relay


async def test_events_match_the_in_process_backend(shared: Harness) -> None:
    direct = FakeBackend(_config())
    await direct.start()
    for request in [_request("the quick brown fox", n=2), _request("a b c d e", max_tokens=3)]:
        relayed = await _collect(shared.backend.generate(request))
        expected = await _collect(direct.generate(request))
        assert isinstance(relayed[0], Started)
        assert _comparable(relayed) == _comparable(expected)
    assert relayed[-2:] == [Finished(index=0, reason="length"), Usage(5, 3)]


async def test_chat_requests_are_relayed(shared: Harness) -> None:
    request = GenerationRequest(
        request_id="chat",
        model="fake",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=10),
        messages=(ChatMessage("system", "ignored"), ChatMessage("user", "hello worker")),
    )
    texts = [
        e.text for e in await _collect(shared.backend.generate(request)) if isinstance(e, TextDelta)
    ]
    assert texts == ["hello", " worker"]


async def test_concurrent_requests_are_multiplexed(shared: Harness) -> None:
    prompts = [" ".join(f"r{i}w{j}" for j in range(4)) for i in range(12)]
    results = await asyncio.gather(
        *(_collect(shared.backend.generate(_request(t))) for t in prompts)
    )
    for prompt, events in zip(prompts, results, strict=True):
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert text == prompt


async def test_info_and_ready_report_the_worker(shared: Harness) -> None:
    info = shared.backend.info()
    assert info.extra["pid"] == str(shared.backend.pid)
    assert info.extra["worker_pid"] == info.extra["pid"]  # the fake reports its own pid
    assert info.extra["pid"] != str(os.getpid())
    assert info.max_context == 2048
    assert await shared.backend.ready() is True


async def test_observer_calls_reach_the_parent_metrics(shared: Harness) -> None:
    before = _sample(shared.registry, "llmso_worker_step_tokens_count")
    await _collect(shared.backend.generate(_request("one two three four five")))
    assert await _wait_until(
        lambda: _sample(shared.registry, "llmso_worker_step_tokens_count") == before + 5
    )
    assert _sample(shared.registry, "llmso_worker_running_requests") == 0


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("prompt", "cls", "fields"),
    [
        ("!error InvalidRequest temperature too hot", base.InvalidRequest,
         {"message": "too hot", "param": "temperature"}),
        ("!error ContextLengthExceeded messages way too long", base.ContextLengthExceeded,
         {"message": "way too long", "param": "messages", "code": "context_length_exceeded"}),
        ("!error Overloaded - queue is full", base.Overloaded,
         {"message": "queue is full", "retry_after": 7.5, "status": 429}),
        ("!error UpstreamRejected top_k not supported", base.UpstreamRejected,
         {"message": "not supported", "param": "top_k", "status": 422, "code": "bad"}),
        ("!bug", BackendError,
         {"message": "worker error: ZeroDivisionError: fake bug", "status": 500}),
    ],
)  # fmt: skip
async def test_errors_are_raised_again_in_the_parent(
    shared: Harness, prompt: str, cls: type[BackendError], fields: dict[str, object]
) -> None:
    with pytest.raises(BackendError) as caught:
        await _collect(shared.backend.generate(_request(prompt)))
    assert type(caught.value) is cls
    for name, value in fields.items():
        assert getattr(caught.value, name) == value, name


async def test_an_error_mid_stream_follows_the_events_before_it(shared: Harness) -> None:
    seen: list[BackendEvent] = []
    with pytest.raises(base.NotReady) as caught:
        async for event in shared.backend.generate(
            _request("!error-after 2 NotReady - warming up")
        ):
            seen.append(event)
    assert [type(e) for e in seen] == [Started, TextDelta, TextDelta]
    assert (caught.value.message, caught.value.retry_after) == ("warming up", 7.5)
    assert await shared.backend.ready() is True  # one failed request does not hurt the worker


# --------------------------------------------------------------------------- cancellation


async def test_closing_the_stream_aborts_the_request_in_the_worker(shared: Harness) -> None:
    aborted = _sample(shared.registry, "llmso_worker_aborted_requests_total")
    stream = shared.backend.generate(_request(" ".join(["word"] * 200)))
    deltas = 0
    async for event in stream:
        deltas += isinstance(event, TextDelta)
        if deltas == 2:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    # The fake counts an abort only when its generator is closed early, in the worker.
    assert await _wait_until(
        lambda: _sample(shared.registry, "llmso_worker_aborted_requests_total") == aborted + 1
    )
    assert await _wait_until(lambda: _sample(shared.registry, "llmso_worker_running_requests") == 0)
    steps = _sample(shared.registry, "llmso_worker_step_tokens_count")
    await asyncio.sleep(0.3)  # ~15 tokens' time: the worker must have stopped producing
    assert _sample(shared.registry, "llmso_worker_step_tokens_count") == steps


async def test_cancelling_the_consumer_task_aborts_the_request(shared: Harness) -> None:
    aborted = _sample(shared.registry, "llmso_worker_aborted_requests_total")
    task = asyncio.create_task(_collect(shared.backend.generate(_request("x " * 200))))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _wait_until(
        lambda: _sample(shared.registry, "llmso_worker_aborted_requests_total") == aborted + 1
    )


# --------------------------------------------------------------------------- crashes


async def test_kill_9_fails_in_flight_requests_and_restart_works() -> None:
    harness = Harness(env={"LLMSO_FAKE_DELAY": "0.02"})
    backend = harness.backend
    await backend.start()
    try:
        old_pid = backend.pid
        assert old_pid is not None
        streams = [backend.generate(_request("w " * 500)) for _ in range(3)]
        for stream in streams:  # every request is in flight in the worker
            assert isinstance(await stream.__anext__(), Started)
        os.kill(old_pid, signal.SIGKILL)
        for stream in streams:
            with pytest.raises(BackendCrashed, match="SIGKILL"):
                while True:
                    await stream.__anext__()
        assert await backend.ready() is False
        with pytest.raises(NotReady):
            await _collect(backend.generate(_request("after the crash")))
        assert await _wait_until(lambda: len(harness.crashes) == 1)
        assert "SIGKILL" in harness.crashes[0]
        assert backend.info().extra.get("pid") is None

        await backend.start()
        assert backend.pid not in (None, old_pid)
        assert await backend.ready() is True
        events = await _collect(backend.generate(_request("back again")))
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "back again"
        assert harness.crashes == [harness.crashes[0]]  # a restart is not another crash
    finally:
        await backend.stop()


async def test_engine_crash_inside_the_worker_is_reported() -> None:
    harness = Harness()
    await harness.backend.start()
    try:
        pid = harness.backend.pid
        with pytest.raises(BackendCrashed):
            await _collect(harness.backend.generate(_request("!crash now")))
        assert await _wait_until(lambda: len(harness.crashes) == 1)
        assert "fake engine thread died" in harness.crashes[0]
        assert pid is not None and await _wait_until(lambda: _pid_gone(pid))
    finally:
        await harness.backend.stop()


# --------------------------------------------------------------------------- lifecycle


async def test_stop_ends_streams_and_leaves_no_process() -> None:
    harness = Harness(env={"LLMSO_FAKE_DELAY": "0.02"})
    await harness.backend.start()
    pid = harness.backend.pid
    assert pid is not None
    stream = harness.backend.generate(_request("w " * 500))
    await stream.__anext__()
    started = time.monotonic()
    await harness.backend.stop()
    assert time.monotonic() - started < 5
    with pytest.raises(BackendCrashed, match="stopped"):
        while True:
            await stream.__anext__()
    assert _pid_gone(pid)
    assert harness.crashes == []  # stopping is not crashing
    assert await harness.backend.ready() is False
    await harness.backend.stop()  # idempotent


async def test_stop_kills_a_worker_that_does_not_exit() -> None:
    harness = Harness(env={"LLMSO_FAKE_STOP_DELAY": "60"}, stop_timeout=0.5)
    await harness.backend.start()
    pid = harness.backend.pid
    assert pid is not None
    started = time.monotonic()
    await harness.backend.stop()
    assert time.monotonic() - started < 3
    assert _pid_gone(pid)


async def test_load_error_surfaces_with_its_message() -> None:
    harness = Harness(env={"LLMSO_FAKE_LOAD_ERROR": "weights not found at /nowhere"})
    with pytest.raises(WorkerStartError, match=r"RuntimeError: weights not found at /nowhere"):
        await harness.backend.start()
    assert harness.backend.pid is None
    assert await harness.backend.ready() is False
    assert harness.crashes == []


async def test_bad_factory_surfaces_with_its_message() -> None:
    harness = Harness(factory="tests.tools.nope:Missing")
    with pytest.raises(WorkerStartError, match="ModuleNotFoundError"):
        await harness.backend.start()


async def test_worker_killed_while_loading_fails_start_not_on_crash() -> None:
    harness = Harness(env={"LLMSO_FAKE_LOAD_DELAY": "60"})
    start = asyncio.create_task(harness.backend.start())
    assert await _wait_until(lambda: harness.backend.pid is not None)
    pid = harness.backend.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerStartError, match=r"died while loading .*SIGKILL"):
        await asyncio.wait_for(start, 10)
    await asyncio.sleep(0.1)
    assert harness.crashes == []
    assert harness.backend.pid is None


async def test_load_timeout_kills_the_worker() -> None:
    registry = CollectorRegistry()
    backend = ProcessBackend(
        _config(load_timeout=1.0),
        BackendMetrics(registry),
        backend_factory=FAKE,
        env={"LLMSO_FAKE_LOAD_DELAY": "60"},
    )
    with pytest.raises(WorkerStartError, match="did not load within 1 s") as caught:
        await backend.start()
    assert backend.pid is None
    found = re.search(r"worker pid (\d+)", caught.value.message)
    assert found is not None
    assert _pid_gone(int(found.group(1)))


_ORPHAN_PARENT = textwrap.dedent(
    """
    import asyncio, sys
    from prometheus_client import CollectorRegistry
    from backends.hop_metrics import BackendMetrics
    from backends.process.backend import ProcessBackend
    from config.schema import HFModelConfig

    async def main():
        config = HFModelConfig(name="orphan", backend="hf", source="x", isolation="process")
        backend = ProcessBackend(config, BackendMetrics(CollectorRegistry()),
                                 backend_factory=sys.argv[1])
        await backend.start()
        print(backend.pid, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


async def test_worker_exits_when_its_parent_is_killed() -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _ORPHAN_PARENT, FAKE, cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert parent.stdout is not None
        worker_pid = int(await asyncio.wait_for(parent.stdout.readline(), 30))
        assert not _pid_gone(worker_pid)
        parent.kill()
        await asyncio.wait_for(parent.wait(), 5)
        assert await _wait_until(lambda: _pid_gone(worker_pid), limit_s=5.0)
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
