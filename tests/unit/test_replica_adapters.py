"""LoRA adapters across replicas (``backends.replicas.adapters``): the pick prefers the
replicas that hold the adapter, one load serves every request that waits for it, lists
read before a load are not trusted, unloads go to the holders. The engine side is a
fake ``AdapterOps`` (its HTTP twin is tested in ``test_openai_adapters.py``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from backends.base import (
    BackendCrashed,
    ChatMessage,
    GenerationRequest,
    RequestKind,
    SamplingParams,
    UpstreamRejected,
    UpstreamUnavailable,
)
from backends.replicas.adapters import Adapters
from backends.replicas.metrics import ReplicaMetrics
from backends.replicas.replica import Replica
from backends.replicas.replica_set import ReplicaSet
from config.schema import OpenAIModelConfig

A, B, C = (f"http://{host}:8000/v1" for host in "abc")


@dataclass
class FakeOps:
    """Records every call; a load takes ``delay`` seconds and may fail with ``error``."""

    lists: dict[str, frozenset[str] | None] = field(default_factory=dict)
    loads: list[tuple[str, str, str]] = field(default_factory=list)
    unloads: list[tuple[str, str]] = field(default_factory=list)
    delay: float = 0.0
    error: Exception | None = None
    gate: asyncio.Event | None = None  # a load waits for it when set

    async def listed(self, replica: Replica) -> frozenset[str] | None:
        if self.gate is not None:
            await self.gate.wait()
        return self.lists.get(replica.url)

    async def load(self, replica: Replica, name: str, source: str) -> None:
        self.loads.append((replica.url, name, source))
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error

    async def unload(self, replica: Replica, name: str) -> None:
        self.unloads.append((replica.url, name))


def _set(
    ops: FakeOps,
    *urls: str,
    catalog: dict[str, str | None] | None = None,
    load: bool = True,
    balance: str = "round_robin",
) -> tuple[ReplicaSet, CollectorRegistry]:
    registry = CollectorRegistry()
    config = OpenAIModelConfig(name="m", backend="openai", replicas=urls, balance=balance)
    adapters = Adapters("m", ops, catalog if catalog is not None else {"x": "/p/x"}, load)
    endpoints = [(url, None) for url in urls]
    return ReplicaSet(config, endpoints, ReplicaMetrics(registry), adapters=adapters), registry


def _request(adapter: str | None = "x") -> GenerationRequest:
    return GenerationRequest(
        "r",
        "m",
        RequestKind.CHAT,
        SamplingParams(max_tokens=4),
        messages=(ChatMessage("user", "hi"),),
        adapter=adapter,
    )


def _routes(registry: CollectorRegistry, url: str, reason: str) -> float:
    labels = {"model": "m", "replica": url, "balance": "round_robin", "reason": reason}
    return registry.get_sample_value("llmso_replica_routes_total", labels) or 0.0


def _loads(registry: CollectorRegistry, url: str, outcome: str) -> float | None:
    labels = {"model": "m", "replica": url, "outcome": outcome}
    return registry.get_sample_value("llmso_adapter_loads_total", labels)


def _adapters(replicas: ReplicaSet) -> Adapters:
    assert replicas.adapters is not None
    return replicas.adapters


def _by_url(replicas: ReplicaSet, url: str) -> Replica:
    return next(r for r in replicas.replicas if r.url == url)


async def test_pick_goes_to_the_holders_and_balances_among_them() -> None:
    replicas, registry = _set(FakeOps(), A, B, C)
    _by_url(replicas, B).adapters = frozenset({"x"})
    _by_url(replicas, C).adapters = frozenset({"x", "y"})
    picked = [replicas.pick(_request(), (), 0) for _ in range(6)]
    assert {r.url for r in picked} == {B, C}  # round robin among the two holders
    assert _routes(registry, B, "adapter") + _routes(registry, C, "adapter") == 6
    # The base model and unknown adapters follow the policy over every replica.
    assert {replicas.pick(_request(None), (), 0).url for _ in range(3)} == {A, B, C}
    # A retry after the holder B failed goes to the other holder.
    assert replicas.pick(_request(), (B,), 1).url == C
    await replicas.stop()


async def test_not_held_and_loadable_loads_once_on_the_least_loaded() -> None:
    ops = FakeOps(delay=0.05)
    replicas, registry = _set(ops, A, B, C)
    _by_url(replicas, A).inflight = 3
    _by_url(replicas, C).inflight = 1
    adapters = _adapters(replicas)

    async def one() -> str:
        replica = replicas.pick(_request(), (), 0)
        await adapters.ready(replica, "x")
        replica.release()
        return replica.url

    urls = await asyncio.gather(*(one() for _ in range(5)))
    assert urls == [B] * 5  # every request waited for the one load on B
    assert ops.loads == [(B, "x", "/p/x")]
    assert _by_url(replicas, B).adapters == {"x"}
    assert _loads(registry, B, "ok") == 1
    assert _routes(registry, B, "adapter") == 5
    await adapters.ready(_by_url(replicas, B), "x")  # held now: no second load
    assert len(ops.loads) == 1
    await replicas.stop()


async def test_without_source_or_with_loading_off_any_replica_takes_it() -> None:
    for catalog, load in (({"x": None}, True), ({"x": "/p/x"}, False)):
        ops = FakeOps()
        replicas, registry = _set(ops, A, B, catalog=catalog, load=load)
        picked = [replicas.pick(_request(), (), 0) for _ in range(4)]
        assert {r.url for r in picked} == {A, B}  # the engine answers (the list may lag)
        for replica in picked:
            await _adapters(replicas).ready(replica, "x")
        assert ops.loads == [] and _routes(registry, A, "adapter") == 0
        await replicas.stop()


async def test_a_refused_load_names_the_model_field_and_the_next_pick_starts_over() -> None:
    ops = FakeOps(error=UpstreamRejected("No adapter found for /p/x", status=404))
    replicas, registry = _set(ops, A, B)
    adapters = _adapters(replicas)
    first = replicas.pick(_request(), (), 0)
    with pytest.raises(UpstreamRejected) as caught:
        await adapters.ready(first, "x")
    error = caught.value
    assert (error.status, error.param, error.code) == (404, "model", "adapter_load_failed")
    assert "'x'" in error.message and "No adapter found" in error.message
    assert _loads(registry, first.url, "rejected") == 1 and "x" not in first.adapters
    first.release()
    # An unreachable target is not retried here: the walk retries elsewhere.
    ops.error = UpstreamUnavailable("connection refused")
    second = replicas.pick(_request(), (first.url,), 1)
    assert second.url != first.url
    with pytest.raises(UpstreamUnavailable):
        await adapters.ready(second, "x")
    assert _loads(registry, second.url, "upstream_unavailable") == 1
    await replicas.stop()


async def test_a_retry_with_no_holder_left_loads_on_another_replica() -> None:
    ops = FakeOps()
    replicas, _ = _set(ops, A, B)
    _by_url(replicas, A).adapters = frozenset({"x"})
    again = replicas.pick(_request(), (A,), 1)  # the holder broke
    assert again.url == B
    await _adapters(replicas).ready(again, "x")
    assert ops.loads == [(B, "x", "/p/x")]
    await replicas.stop()


async def test_a_list_read_before_our_load_finished_is_not_trusted() -> None:
    gate = asyncio.Event()
    ops = FakeOps(lists={A: frozenset(), B: frozenset({"y"})}, gate=gate)
    replicas, _ = _set(ops, A, B, catalog={"x": "/p/x", "y": None})
    adapters = _adapters(replicas)
    listing = asyncio.create_task(adapters.refresh(replicas.replicas))
    await asyncio.sleep(0)  # the list is being read ...
    await adapters.ready(_by_url(replicas, A), "x")  # ... when our load ends
    gate.set()
    await listing
    assert _by_url(replicas, A).adapters == {"x"}  # the older list did not erase it
    assert _by_url(replicas, B).adapters == {"y"}
    await adapters.refresh(replicas.replicas)  # a later read is the truth
    assert _by_url(replicas, A).adapters == frozenset()
    assert replicas.snapshot()[1]["adapters"] == ["y"]
    await replicas.stop()


async def test_probes_read_the_lists_and_skip_them_without_adapters() -> None:
    ops = FakeOps(lists={A: frozenset({"x"}), B: None})

    async def probe(replica: Replica) -> bool:
        return True

    replicas, _ = _set(ops, A, B)
    assert await replicas.probe_all(probe)
    assert _by_url(replicas, A).adapters == {"x"} and _by_url(replicas, B).adapters == frozenset()
    await replicas.stop()
    bare, _ = _set(ops, A, B, catalog={})
    await bare.probe_all(probe)
    assert all(not r.adapters for r in bare.replicas)
    await bare.stop()


async def test_unload_goes_to_the_holders_after_loads_in_flight() -> None:
    ops = FakeOps(delay=0.05)
    replicas, _ = _set(ops, A, B, C)
    adapters = _adapters(replicas)
    _by_url(replicas, A).adapters = frozenset({"x"})
    loading = asyncio.create_task(adapters.ready(_by_url(replicas, C), "x"))
    await asyncio.sleep(0)
    adapters.forget("x")
    await adapters.unload("x", replicas.replicas)
    await loading
    assert sorted(ops.unloads) == [(A, "x"), (C, "x")]
    assert all("x" not in r.adapters for r in replicas.replicas)
    assert not adapters.known("x")
    await replicas.stop()


async def test_a_load_cancelled_by_stop_ends_its_waiters_as_crashed() -> None:
    ops = FakeOps(delay=10.0)
    replicas, _ = _set(ops, A)
    waiter = asyncio.create_task(_adapters(replicas).ready(replicas.replicas[0], "x"))
    await asyncio.sleep(0.01)
    await replicas.stop()
    with pytest.raises(BackendCrashed):
        await waiter


async def test_a_removed_replica_forgets_its_load_series() -> None:
    ops = FakeOps()
    replicas, registry = _set(ops, A, B)
    await _adapters(replicas).ready(_by_url(replicas, B), "x")
    assert _loads(registry, B, "ok") == 1
    config = OpenAIModelConfig(name="m", backend="openai", replicas=(A,), balance="round_robin")
    replicas.update(config, [(A, None)])
    assert _loads(registry, B, "ok") is None
    await replicas.stop()
