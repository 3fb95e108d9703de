"""Hot reload: apply_config with leases in flight, and the file/SIGHUP watcher."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from gateway.registry import (
    Backoff,
    ModelNotFound,
    ModelRegistry,
    ModelState,
    RegistryMetrics,
)
from tests.tools.registry_fakes import FakeFactory, app_config, fake_model, wait_until


@pytest.fixture
async def setup() -> AsyncIterator[tuple[ModelRegistry, FakeFactory, CollectorRegistry]]:
    config = app_config(
        fake_model("keep", preload=True),
        fake_model("swap", preload=True),
        fake_model("drop", preload=True),
    )
    prometheus = CollectorRegistry()
    factory = FakeFactory()
    registry = ModelRegistry(
        config, RegistryMetrics(prometheus), factory, backoff=Backoff(0.05, 0.1)
    )
    await registry.start()
    yield registry, factory, prometheus
    await registry.stop()


async def _hold(registry: ModelRegistry, name: str, release: asyncio.Event) -> list[str]:
    """Stream a whole request on the leased backend once released; return its text."""
    async with registry.lease(name) as lease:
        await release.wait()
        texts = []
        async for event in lease.backend.generate(None):  # type: ignore[arg-type]
            texts.append(getattr(event, "text", ""))
        return texts


def _states(registry: ModelRegistry) -> dict[str, ModelState]:
    return {status.name: status.state for status in registry.list_models()}


async def test_apply_config_with_leases_in_flight(
    setup: tuple[ModelRegistry, FakeFactory, CollectorRegistry],
) -> None:
    registry, factory, prometheus = setup
    release = asyncio.Event()
    old_swap, old_drop = factory.last("swap"), factory.last("drop")
    holders = [asyncio.create_task(_hold(registry, n, release)) for n in ("swap", "drop")]
    await wait_until(lambda: _states(registry)["drop"] is ModelState.ACTIVE)
    new = app_config(
        fake_model("keep", preload=True, priority=4),
        fake_model("swap", preload=True, upstream_model="other"),
        fake_model("fresh", preload=True),
    )
    diff = await registry.apply_config(new)
    assert (diff.added, diff.removed, diff.reloaded, diff.updated) == (
        ("fresh",),
        ("drop",),
        ("swap",),
        ("keep",),
    )
    with pytest.raises(ModelNotFound):
        registry.route("drop")
    await wait_until(
        lambda: _states(registry)["swap"] is ModelState.READY and len(factory.built["swap"]) == 2
    )
    await wait_until(lambda: _states(registry)["fresh"] is ModelState.READY)
    async with registry.lease("swap") as lease:  # new leases get the new backend
        assert lease.backend is factory.last("swap")
        assert lease.config.upstream_model == "other"  # type: ignore[union-attr]
    assert not old_swap.stopped and not old_drop.stopped  # still serving their leases
    assert [s.name for s in registry.list_models()] == ["keep", "swap", "fresh"]
    assert registry.list_models()[1].inflight == 1  # the old lease is still counted
    release.set()
    results = await asyncio.gather(*holders)
    assert [r[1] for r in results] == ["swap", "drop"]  # both streams finished whole
    await wait_until(lambda: old_swap.stopped and old_drop.stopped)
    assert len(factory.built["keep"]) == 1  # an in-place update keeps the backend
    assert registry.list_models()[0].priority == 4
    assert (
        prometheus.get_sample_value(
            "llmso_model_evictions_total", {"model": "swap", "reason": "config_changed"}
        )
        == 1
    )
    assert (
        prometheus.get_sample_value("llmso_model_state", {"model": "drop", "state": "ready"})
        is None
    )  # a removed model's state series is gone


async def test_back_to_back_reloads_leave_one_backend(
    setup: tuple[ModelRegistry, FakeFactory, CollectorRegistry],
) -> None:
    registry, factory, _ = setup
    factory.plan("swap").load_seconds = 0.05
    for port in (11, 12, 13):
        swapped = fake_model("swap", preload=True, base_url=f"http://127.0.0.1:{port}/v1")
        await registry.apply_config(app_config(fake_model("keep", preload=True), swapped))
    await wait_until(lambda: _states(registry)["swap"] is ModelState.READY)
    await asyncio.sleep(0.1)
    live = [b for b in factory.built["swap"] if not b.stopped]
    assert len(live) == 1
    async with registry.lease("swap") as lease:
        assert lease.backend is live[0]
        assert lease.config.base_url.endswith(":13/v1")  # type: ignore[union-attr]


async def test_adapters_registered_at_run_time_stay_with_models_that_keep_running(
    setup: tuple[ModelRegistry, FakeFactory, CollectorRegistry],
) -> None:
    """An adapter registered at run time routes to its base at once; a hot reload keeps
    it where the base model's backend keeps running (changed in place) and drops it
    where the base restarts on the file's config; names stay unique."""
    from backends.base import AdapterSpec
    from backends.errors import InvalidRequest

    registry, factory, _ = setup
    await registry.add_adapter("keep", AdapterSpec("keep-sql", "/srv/sql", ("sql",)))
    await registry.add_adapter("swap", AdapterSpec("swap-poet", None))
    assert factory.last("keep").adapters["keep-sql"].source == "/srv/sql"
    decision = registry.route("sql")
    assert (decision.candidates, decision.adapter) == (("keep",), "keep-sql")
    with pytest.raises(InvalidRequest, match="already in use"):
        await registry.add_adapter("swap", AdapterSpec("keep", None))
    with pytest.raises(InvalidRequest, match="already in use"):
        await registry.add_adapter("swap", AdapterSpec("other", None, ("sql",)))

    new = app_config(
        fake_model("keep", preload=True, priority=4),  # in place: the backend stays
        fake_model("swap", preload=True, upstream_model="other"),  # restarts
        fake_model("drop", preload=True),
    )
    diff = await registry.apply_config(new)
    assert (diff.reloaded, diff.updated) == (("swap",), ("keep",))
    assert registry.route("keep-sql").adapter == "keep-sql"
    [keep] = [s for s in registry.list_models() if s.name == "keep"]
    assert keep.adapters == (("keep-sql", ("sql",)),)
    with pytest.raises(ModelNotFound):
        registry.route("swap-poet")

    await registry.remove_adapter("keep", "keep-sql")
    assert "keep-sql" not in factory.last("keep").adapters
    with pytest.raises(ModelNotFound):
        registry.route("sql")
    with pytest.raises(ModelNotFound):
        await registry.remove_adapter("keep", "keep-sql")
