"""``ReplicaSet.update``: the in-place replica list change behind hot reload."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from backends.replicas.metrics import ReplicaMetrics
from backends.replicas.replica_set import ReplicaSet
from config.schema import OpenAIModelConfig

A, B, C = (f"http://{host}:8000/v1" for host in "abc")


def _config(*urls: str) -> OpenAIModelConfig:
    return OpenAIModelConfig(name="m", backend="openai", replicas=urls, balance="round_robin")


def _endpoints(*urls: str) -> list[tuple[str, str | None]]:
    return [(url, None) for url in urls]


def _up(registry: CollectorRegistry, url: str) -> float | None:
    return registry.get_sample_value("llmso_replica_up", {"model": "m", "replica": url})


async def test_removed_replica_drains_and_a_returning_one_is_the_same() -> None:
    registry = CollectorRegistry()
    replicas = ReplicaSet(_config(A, B), _endpoints(A, B), ReplicaMetrics(registry))
    on_a = replicas.pick(None, (), 0)
    assert on_a.url == A
    kept_b = replicas.replicas[1]
    removed = replicas.update(_config(B, C), _endpoints(B, C))
    assert removed == [on_a] and on_a.draining
    assert [r.url for r in replicas.replicas] == [B, C] and replicas.replicas[0] is kept_b
    picks = [replicas.pick(None, (), 0) for _ in range(4)]
    assert {r.url for r in picks} == {B, C}  # A gets nothing
    for replica in picks:
        replica.release()
    assert _up(registry, A) == 0  # still exported while its request runs
    # Listed again before its request ended: the same replica, nothing forgotten.
    replicas.update(_config(A, B, C), _endpoints(A, B, C))
    assert replicas.replicas[0] is on_a and not on_a.draining
    on_a.release()
    await asyncio.sleep(0)
    assert _up(registry, A) is not None
    # Removed while idle: its series go at once.
    replicas.update(_config(A, B), _endpoints(A, B))
    assert _up(registry, C) is None and _up(registry, A) is not None
    await replicas.stop()


async def test_removed_replica_series_go_when_its_last_request_ends() -> None:
    registry = CollectorRegistry()
    replicas = ReplicaSet(_config(A, B), _endpoints(A, B), ReplicaMetrics(registry))
    held = replicas.pick(None, (), 0)
    replicas.update(_config(B), _endpoints(B))
    assert _up(registry, held.url) == 0
    held.release()
    for _ in range(3):
        await asyncio.sleep(0)
    assert _up(registry, held.url) is None
    await replicas.stop()
