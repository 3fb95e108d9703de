"""Fake upstream replicas behind one ``openai`` backend, for the replica and failover
service tests (``fleet_of`` in ``tests/service/conftest.py`` builds them)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from backends.hop_metrics import BackendMetrics
from backends.openai_proxy.backend import OpenAIProxyBackend
from bench.fake_upstream import FakeOptions, FakeUpstream
from config.schema import OpenAIModelConfig


class Fleet:
    """Fake upstream replicas and one backend in front of them."""

    def __init__(
        self, fakes: list[FakeUpstream], backend: OpenAIProxyBackend, registry: CollectorRegistry
    ):
        self.fakes = fakes
        self.backend = backend
        self.registry = registry

    def sample(self, name: str, replica: FakeUpstream | None = None, **labels: str) -> float:
        """A metric of model ``proxy`` (of one ``replica`` when given)."""
        where = {"replica": f"{replica.url}/v1"} if replica is not None else {}
        value = self.registry.get_sample_value(name, {"model": "proxy", **where, **labels})
        return value or 0.0

    def served(self) -> list[int]:
        return [len(fake.bodies) for fake in self.fakes]


def fleet_entry(fakes: list[FakeUpstream], **overrides: Any) -> dict[str, Any]:
    """The config entry of model ``proxy`` over ``fakes`` (fast probes and scrapes)."""
    return {
        "name": "proxy",
        "backend": "openai",
        "replicas": [f"{fake.url}/v1" for fake in fakes],
        "upstream_model": "fake-model",
        "health_interval": 0.05,
        "connect_timeout": 1.0,
        "metrics_scrape_interval": 0.05,
        **overrides,
    }


class Fleets:
    """Builds fleets and stops them all at the end (the fixture's state)."""

    def __init__(self) -> None:
        self.made: list[Fleet] = []

    async def __call__(self, options: list[FakeOptions], **overrides: Any) -> Fleet:
        fakes = [FakeUpstream(o) for o in options]
        for fake in fakes:
            await fake.start()
        registry = CollectorRegistry()
        config = OpenAIModelConfig(**fleet_entry(fakes, **overrides))
        backend = OpenAIProxyBackend(config, BackendMetrics(registry))
        await backend.start()
        self.made.append(Fleet(fakes, backend, registry))
        return self.made[-1]

    async def stop(self) -> None:
        for fleet in self.made:
            await fleet.backend.stop()
            for fake in fleet.fakes:
                await fake.stop()
