"""ModelRegistry lifecycle with scripted fake backends: lazy load, single-flight, eviction,
draining, idle TTL, load failure and backoff, crash and restart, metrics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.base import BackendError
from config.schema import AppConfig
from gateway.registry import (
    Backoff,
    ModelNotFound,
    ModelOverloaded,
    ModelRegistry,
    ModelState,
    ModelUnavailable,
    RegistryMetrics,
)
from tests.tools.registry_fakes import FakeFactory, app_config, fake_model, wait_until

Built = tuple[ModelRegistry, FakeFactory, CollectorRegistry]
Make = Callable[..., Built]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    registries: list[ModelRegistry] = []

    def build(config: AppConfig, **kwargs: Any) -> Built:
        prometheus = CollectorRegistry()
        factory = FakeFactory()
        kwargs.setdefault("backoff", Backoff(base=0.1, cap=0.4))
        registry = ModelRegistry(config, RegistryMetrics(prometheus), factory, **kwargs)
        registries.append(registry)
        return registry, factory, prometheus

    yield build
    for registry in registries:
        await registry.stop()


def sample(prometheus: CollectorRegistry, name: str, **labels: str) -> float:
    value = prometheus.get_sample_value(name, labels)
    return 0.0 if value is None else value


def transitions(caplog: pytest.LogCaptureFixture, model: str) -> list[str]:
    """States a model went through, from the registry's debug log of each transition."""
    states: list[str] = []
    for record in caplog.records:
        args = record.args
        if record.msg == "model %s: %s -> %s" and isinstance(args, tuple) and args[0] == model:
            states.append(str(args[2]))
    return states


async def hold(
    registry: ModelRegistry, name: str, release: asyncio.Event, holding: asyncio.Event | None = None
) -> str:
    async with registry.lease(name) as lease:
        if holding is not None:
            holding.set()
        await release.wait()
        return lease.name


# --------------------------------------------------------------------------- Lab 05 table


async def _ready_model(
    registry: ModelRegistry, factory: FakeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    await registry.load("small")
    caplog.clear()
    decision = registry.route("small")
    async with registry.lease(decision.candidates[0]) as lease:
        assert lease.name == "small"
    assert factory.plan("small").starts == 1  # no second load
    assert transitions(caplog, "small") == ["active", "ready"]


async def _unloaded_model(
    registry: ModelRegistry, factory: FakeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    async with registry.lease("small") as lease:
        assert lease.backend is factory.last("small")
    assert transitions(caplog, "small") == ["loading", "ready", "active", "ready"]


async def _loading_same_model(
    registry: ModelRegistry, factory: FakeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    factory.plan("small").load_seconds = 0.1
    first = asyncio.ensure_future(registry.load("small"))
    await wait_until(lambda: registry.list_models()[0].state is ModelState.LOADING)
    async with registry.lease("small") as lease:
        assert lease.name == "small"
    await first
    assert factory.plan("small").starts == 1


async def _not_found(
    registry: ModelRegistry, factory: FakeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ModelNotFound) as caught:
        registry.route("gpt-17")
    assert (caught.value.status, caught.value.code) == (404, "model_not_found")
    with pytest.raises(ModelNotFound):
        async with registry.lease("gpt-17"):
            pass
    assert factory.built == {}


async def _capability_only(
    registry: ModelRegistry, factory: FakeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    await registry.load("big")  # ready beats a higher priority that would have to load
    decision = registry.route("capability:chat")
    assert decision.reason == "capability"
    assert decision.candidates == ("big", "small")
    async with registry.lease(decision.candidates[0]) as lease:
        assert lease.name == "big"


@pytest.mark.parametrize(
    "scenario",
    [_ready_model, _unloaded_model, _loading_same_model, _not_found, _capability_only],
    ids=["ready-model", "unloaded-model", "loading-same-model", "not-found", "capability-only"],
)
async def test_lab05_scenarios(
    make: Make, caplog: pytest.LogCaptureFixture, scenario: Callable[..., Any]
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.registry")
    config = app_config(
        fake_model("small", capabilities=["chat", "small"], priority=10),
        fake_model("big", capabilities=["chat"], priority=1),
    )
    registry, factory, _ = make(config)
    await registry.start()
    await scenario(registry, factory, caplog)


# --------------------------------------------------------------------------- loading


async def test_single_flight_twenty_concurrent_leases(make: Make) -> None:
    registry, factory, prometheus = make(app_config(fake_model("m")))
    await registry.start()
    factory.plan("m").load_seconds = 0.1
    release = asyncio.Event()
    holders = [asyncio.create_task(hold(registry, "m", release)) for _ in range(20)]
    await wait_until(lambda: registry.list_models()[0].inflight == 20)
    assert factory.plan("m").starts == 1
    assert len(factory.built["m"]) == 1
    assert registry.list_models()[0].state is ModelState.ACTIVE
    assert sample(prometheus, "llmso_model_inflight", model="m") == 20
    assert sample(prometheus, "llmso_model_state", model="m", state="active") == 1
    assert sample(prometheus, "llmso_model_state", model="m", state="ready") == 0
    release.set()
    assert await asyncio.gather(*holders) == ["m"] * 20
    assert registry.list_models()[0].state is ModelState.READY
    assert sample(prometheus, "llmso_model_inflight", model="m") == 0
    assert sample(prometheus, "llmso_model_loads_total", model="m", result="success") == 1
    assert sample(prometheus, "llmso_model_load_seconds_count", model="m") == 1
    assert sample(prometheus, "llmso_model_load_seconds_sum", model="m") >= 0.1


async def test_waiters_give_up_after_load_timeout_with_retry_after(make: Make) -> None:
    registry, factory, _ = make(app_config(fake_model("m", load_timeout=5)))
    await registry.start()
    factory.plan("m").load_seconds = 0.3
    with pytest.raises(ModelUnavailable) as caught:
        async with registry.lease("m", max_wait=0.05):
            pass
    assert caught.value.status == 503 and caught.value.retry_after > 0
    async with registry.lease("m") as lease:  # the load went on meanwhile
        assert lease.name == "m"
    assert factory.plan("m").starts == 1


async def test_preload_and_readiness(make: Make) -> None:
    config = app_config(fake_model("a", preload=True), fake_model("b"))
    registry, _, _ = make(config)
    assert not registry.is_ready()
    await registry.start()
    assert registry.is_ready()
    states = {s.name: s.state for s in registry.list_models()}
    assert states == {"a": ModelState.READY, "b": ModelState.UNLOADED}


async def test_list_models_reports_backend_facts(make: Make) -> None:
    config = app_config(fake_model("a", aliases=["alpha", "first"]), fake_model("b"))
    registry, factory, _ = make(config)
    await registry.start()
    factory.plan("a").memory_bytes = 12345
    await registry.load("alpha")
    statuses = registry.list_models()
    assert [s.name for s in statuses] == ["a", "b"]  # aliases do not duplicate
    a = statuses[0]
    assert a.pid == factory.last("a").pid
    assert a.memory_bytes == 12345
    assert a.aliases == ("alpha", "first")
    assert a.owned_by == "tests" and a.loaded_at is not None and a.last_error is None
    assert statuses[1].pid is None and statuses[1].loaded_at is None


async def test_max_concurrency_overloaded(make: Make) -> None:
    registry, _, _ = make(app_config(fake_model("m", max_concurrency=1, queue_timeout=0)))
    await registry.start()
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "m", release, holding))
    await holding.wait()
    with pytest.raises(ModelOverloaded) as caught:
        async with registry.lease("m"):
            pass
    assert (caught.value.status, caught.value.code) == (429, "model_overloaded")
    release.set()
    await holder
    async with registry.lease("m"):
        pass


async def test_a_relay_that_waits_for_its_slots_is_not_refused(make: Make) -> None:
    """An openai model with a queue_timeout queues beyond max_concurrency in its own
    (fair) slot line, so the registry lets the request through to it."""
    registry, _, _ = make(app_config(fake_model("m", max_concurrency=1)))
    await registry.start()
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "m", release, holding))
    await holding.wait()
    async with registry.lease("m"):
        assert registry.list_models()[0].inflight == 2
    release.set()
    await holder


# --------------------------------------------------------------------------- memory


async def test_eviction_lru_under_budget(make: Make) -> None:
    config = app_config(
        *(fake_model(name, memory_bytes=100) for name in ("a", "b", "c")), budget=250
    )
    registry, factory, prometheus = make(config)
    await registry.start()
    for name in ("a", "b", "a"):  # b is now the least recently used
        async with registry.lease(name):
            pass
    async with registry.lease("c"):
        pass
    states = {s.name: s.state for s in registry.list_models()}
    assert states == {"a": ModelState.READY, "b": ModelState.UNLOADED, "c": ModelState.READY}
    assert factory.last("b").stopped and not factory.last("a").stopped
    assert sample(prometheus, "llmso_model_evictions_total", model="b", reason="memory") == 1
    assert sample(prometheus, "llmso_model_evictions_total", model="a", reason="memory") == 0


async def test_budget_for_one_drains_in_flight_never_cuts(make: Make) -> None:
    config = app_config(
        fake_model("a", memory_bytes=100), fake_model("b", memory_bytes=100), budget=150
    )
    registry, factory, _ = make(config)
    await registry.start()
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "a", release, holding))
    await holding.wait()
    loading_b = asyncio.create_task(registry.load("b"))
    await wait_until(lambda: registry.list_models()[0].state is ModelState.DRAINING)
    await asyncio.sleep(0.05)
    backend_a = factory.last("a")
    assert not backend_a.stopped and not loading_b.done()
    assert "b" not in factory.built  # b waits for the memory, it does not overcommit
    with pytest.raises(ModelUnavailable):  # a draining model takes no new leases
        async with registry.lease("a"):
            pass
    release.set()
    assert await holder == "a"
    status = await loading_b
    assert status.state is ModelState.READY and backend_a.stopped
    assert registry.list_models()[0].state is ModelState.UNLOADED


async def test_model_larger_than_budget_fails_with_reason(make: Make) -> None:
    registry, _, _ = make(app_config(fake_model("huge", memory_bytes=500), budget=100))
    await registry.start()
    with pytest.raises(ModelUnavailable) as caught:
        async with registry.lease("huge"):
            pass
    assert "budget" in caught.value.message
    assert "budget" in (registry.list_models()[0].last_error or "")


async def test_idle_ttl_unloads(make: Make) -> None:
    registry, factory, prometheus = make(
        app_config(fake_model("m", idle_ttl=0.15)), sweep_interval=0.03
    )
    await registry.start()
    async with registry.lease("m"):
        await asyncio.sleep(0.25)  # in flight: never idle, whatever the TTL
    assert registry.list_models()[0].state is ModelState.READY
    await wait_until(lambda: registry.list_models()[0].state is ModelState.UNLOADED, 2.0)
    assert factory.last("m").stopped
    assert sample(prometheus, "llmso_model_evictions_total", model="m", reason="idle_ttl") == 1
    async with registry.lease("m"):  # loads again on demand
        pass
    assert factory.plan("m").starts == 2


async def test_unload_waits_for_in_flight_lease(make: Make) -> None:
    registry, factory, _ = make(app_config(fake_model("m")))
    await registry.start()
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "m", release, holding))
    await holding.wait()
    unloading = asyncio.create_task(registry.unload("m"))
    await asyncio.sleep(0.05)
    assert not unloading.done() and not factory.last("m").stopped
    release.set()
    await holder
    assert (await unloading).state is ModelState.UNLOADED
    assert factory.last("m").stopped


async def test_stop_drains_then_stops_everything(make: Make) -> None:
    registry, factory, _ = make(app_config(fake_model("a"), fake_model("b")), drain_timeout=0.2)
    await registry.start()
    await registry.load("b")
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "a", release, holding))
    await holding.wait()
    asyncio.get_running_loop().call_later(0.05, release.set)
    await registry.stop()  # the lease ends within the drain timeout: nothing is cut off
    assert holder.done() and await holder == "a"
    assert factory.last("a").stopped and factory.last("b").stopped
    assert {s.state for s in registry.list_models()} == {ModelState.UNLOADED}
    with pytest.raises(ModelUnavailable):
        async with registry.lease("a"):
            pass


async def test_stop_gives_up_on_a_lease_after_drain_timeout(make: Make) -> None:
    registry, factory, _ = make(app_config(fake_model("a")), drain_timeout=0.1)
    await registry.start()
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "a", release, holding))
    await holding.wait()
    await asyncio.wait_for(registry.stop(), 2.0)
    assert factory.last("a").stopped and not holder.done()
    release.set()
    await holder


# --------------------------------------------------------------------------- failures


async def test_load_failure_backoff_then_recovery(make: Make) -> None:
    registry, factory, prometheus = make(app_config(fake_model("m")))
    await registry.start()
    factory.plan("m").fail_starts = 1
    with pytest.raises(ModelUnavailable) as caught:
        async with registry.lease("m"):
            pass
    assert "corrupt" in caught.value.message and caught.value.retry_after >= 0.1
    status = registry.list_models()[0]
    assert status.state is ModelState.FAILED and "corrupt" in (status.last_error or "")
    assert status.retry_in is not None and 0 < status.retry_in <= 0.1
    with pytest.raises(ModelUnavailable):  # inside the backoff: no new attempt
        async with registry.lease("m"):
            pass
    assert factory.plan("m").starts == 1
    await asyncio.sleep(0.12)
    async with registry.lease("m"):
        pass
    assert factory.plan("m").starts == 2
    assert sample(prometheus, "llmso_model_loads_total", model="m", result="failure") == 1
    assert sample(prometheus, "llmso_model_loads_total", model="m", result="success") == 1


async def test_admin_load_ignores_backoff_and_unload_waits_for_a_load(make: Make) -> None:
    registry, factory, _ = make(app_config(fake_model("m")), backoff=Backoff(30.0, 60.0))
    await registry.start()
    factory.plan("m").fail_starts = 1
    with pytest.raises(ModelUnavailable):
        await registry.load("m")
    assert registry.list_models()[0].retry_in is not None  # 30 s for lazy leases...
    factory.plan("m").load_seconds = 0.05
    loading = asyncio.create_task(registry.load("m"))  # ...but an operator may insist
    await wait_until(lambda: registry.list_models()[0].state is ModelState.LOADING)
    status = await registry.unload("m")  # finishes the load, then drains it
    assert status.state is ModelState.UNLOADED and factory.last("m").stopped
    assert (await loading).state in (ModelState.READY, ModelState.UNLOADED)
    assert factory.plan("m").starts == 2


async def test_load_timeout_marks_failed(make: Make) -> None:
    registry, factory, prometheus = make(app_config(fake_model("m", load_timeout=0.1)))
    await registry.start()
    factory.plan("m").load_seconds = 1.0
    with pytest.raises(ModelUnavailable) as caught:
        await registry.load("m")
    assert "timed out" in caught.value.message
    assert factory.last("m").stopped  # a half-started backend is cleaned up
    assert sample(prometheus, "llmso_model_loads_total", model="m", result="timeout") == 1


async def test_backoff_is_exponential_and_capped() -> None:
    backoff = Backoff(base=0.5, cap=3.0)
    assert [backoff.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]


async def test_crash_marks_failed_then_restarts(make: Make) -> None:
    registry, factory, prometheus = make(app_config(fake_model("m", preload=True)))
    await registry.start()
    first = factory.last("m")
    release, holding = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold(registry, "m", release, holding))
    await holding.wait()
    first.crash("worker pid 4242 killed by SIGKILL")
    status = registry.list_models()[0]
    assert status.state is ModelState.FAILED
    assert "SIGKILL" in (status.last_error or "")
    assert not registry.is_ready()
    with pytest.raises(ModelUnavailable):
        async with registry.lease("m"):
            pass
    release.set()
    await holder  # the lease on the dead backend still ends cleanly
    await wait_until(lambda: registry.list_models()[0].state is ModelState.READY)
    assert len(factory.built["m"]) == 2 and first.stopped
    assert registry.is_ready()
    assert registry.list_models()[0].restarts == 1
    assert sample(prometheus, "llmso_worker_restarts_total", model="m") == 1
    async with registry.lease("m") as lease:
        assert lease.backend is factory.last("m")


async def test_crash_reported_from_another_thread(make: Make) -> None:
    registry, factory, _ = make(app_config(fake_model("m", preload=True)))
    await registry.start()
    await asyncio.to_thread(factory.last("m").crash, "engine thread died")
    await wait_until(lambda: len(factory.built["m"]) == 2)
    assert "engine thread died" in (registry.list_models()[0].last_error or "")


async def test_restart_that_fails_keeps_retrying(make: Make) -> None:
    registry, factory, prometheus = make(app_config(fake_model("m", preload=True)))
    await registry.start()
    factory.plan("m").fail_starts = 1
    factory.last("m").crash()
    await wait_until(lambda: factory.plan("m").starts == 3)
    await wait_until(lambda: registry.list_models()[0].state is ModelState.READY)
    assert sample(prometheus, "llmso_worker_restarts_total", model="m") == 2


# --------------------------------------------------------------------------- routing


async def test_route_metrics_and_fallback_record(make: Make) -> None:
    config = app_config(fake_model("a", aliases=["x"], fallback=["b"]), fake_model("b"))
    registry, _, prometheus = make(config)
    assert registry.route("x").candidates == ("a", "b")
    with pytest.raises(ModelNotFound):
        registry.route("nope")
    registry.record_fallback("a", "b", "ModelUnavailable")
    assert sample(prometheus, "llmso_route_decisions_total", reason="alias") == 1
    assert sample(prometheus, "llmso_route_decisions_total", reason="not_found") == 1
    assert sample(prometheus, "llmso_route_decisions_total", reason="fallback") == 1


async def test_errors_are_backend_errors() -> None:
    for error, status, code in [
        (ModelNotFound("x"), 404, "model_not_found"),
        (ModelUnavailable("x", retry_after=3), 503, "model_not_ready"),
        (ModelOverloaded("x", retry_after=3, code="model_overloaded"), 429, "model_overloaded"),
    ]:
        assert isinstance(error, BackendError)
        assert (error.status, error.code) == (status, code)
