"""Replicas behind one ``openai`` model, against in-process fake upstreams: the balance
policies, health and ejection, retries on another replica, re-admission, aborts, the
``x-session-id`` header through a real app, and the per-replica metrics."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from backends.base import (
    ChatMessage,
    GenerationRequest,
    RequestKind,
    SamplingParams,
    TextDelta,
    Usage,
)
from backends.openai_proxy.backend import OpenAIProxyBackend
from backends.replicas.balance import PrefixAffinity, affinity_key
from bench.fake_upstream import WORDS, FakeOptions, FakeUpstream
from config.schema import AppConfig, OpenAIModelConfig
from gateway.app import build_app
from tests.tools.fleet import fleet_entry


def _config(fakes: list[FakeUpstream], **overrides: Any) -> OpenAIModelConfig:
    return OpenAIModelConfig(**fleet_entry(fakes, **overrides))


def _chat(text: str = "say hello", max_tokens: int = 4, **fields: Any) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="proxy",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        messages=(ChatMessage("user", text),),
        **fields,
    )


async def _text(backend: OpenAIProxyBackend, request: GenerationRequest) -> str:
    events = [event async for event in backend.generate(request)]
    assert isinstance(events[-1], Usage)
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def _burst(
    backend: OpenAIProxyBackend, requests: list[GenerationRequest], width: int
) -> None:
    gate = asyncio.Semaphore(width)

    async def one(request: GenerationRequest) -> None:
        async with gate:
            assert await _text(backend, request) == "".join(WORDS[: request.sampling.max_tokens])

    await asyncio.gather(*(one(r) for r in requests))


async def _until(predicate: Any, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_least_loaded_sends_less_to_a_slow_replica(fleet_of: Any) -> None:
    fleet = await fleet_of([FakeOptions(delay_ms=1), FakeOptions(delay_ms=40)])
    await _burst(fleet.backend, [_chat(max_tokens=6) for _ in range(48)], width=6)
    fast, slow = fleet.served()
    assert fast + slow == 48
    assert slow < fast / 2, (fast, slow)
    routes = fleet.sample(
        "llmso_replica_routes_total", fleet.fakes[0], balance="least_loaded", reason="p2c"
    )
    assert routes == fast


async def test_least_loaded_reads_the_engines_queue_gauges(fleet_of: Any) -> None:
    fleet = await fleet_of([FakeOptions(), FakeOptions()])
    queued = fleet.fakes[0]
    queued.waiting, queued.kv_usage = 12, 0.9
    await _until(lambda: fleet.sample("llmso_replica_queue_depth", queued) == 12)
    assert fleet.sample("llmso_replica_kv_cache_usage_ratio", queued) == pytest.approx(0.9)
    for _ in range(10):
        await _text(fleet.backend, _chat())
    assert fleet.served() == [0, 10]


async def test_round_robin_alternates(fleet_of: Any) -> None:
    fleet = await fleet_of([FakeOptions()] * 3, balance="round_robin")
    for _ in range(9):
        await _text(fleet.backend, _chat())
    assert fleet.served() == [3, 3, 3]


async def test_dead_replica_costs_no_failed_request_and_comes_back(fleet_of: Any) -> None:
    fleet = await fleet_of(
        [FakeOptions(), FakeOptions(), FakeOptions()],
        balance="round_robin",
        breaker_failures=2,
        breaker_cooldown=0.3,
        health_failures_down=2,
        health_successes_up=2,
    )
    dead = fleet.fakes[1]
    port = dead.port
    await dead.stop()  # connection refused from now on
    await _burst(fleet.backend, [_chat() for _ in range(30)], width=3)  # every one succeeds
    assert sum(fleet.served()) == 30
    await _until(lambda: fleet.sample("llmso_replica_up", dead) == 0)
    refused = fleet.sample("llmso_replica_requests_total", dead, outcome="upstream_unavailable")
    assert refused >= 1  # it was tried, then retried elsewhere
    before = fleet.served()
    await _burst(fleet.backend, [_chat() for _ in range(12)], width=3)
    assert (
        fleet.sample("llmso_replica_requests_total", dead, outcome="upstream_unavailable")
        == refused
    )
    assert sum(fleet.served()) - sum(before) == 12  # a dead replica gets nothing now
    # Back on the same port: probes re-admit it after health_successes_up passes.
    revived = FakeUpstream()
    await revived.start(port=port)
    fleet.fakes[1] = revived
    try:
        await _until(lambda: fleet.sample("llmso_replica_up", revived) == 1)
        await _burst(fleet.backend, [_chat() for _ in range(9)], width=1)
        assert len(revived.bodies) == 3
    finally:
        await revived.stop()
        fleet.fakes[1] = dead


async def test_5xx_outlier_is_ejected_and_retried_elsewhere(fleet_of: Any) -> None:
    fleet = await fleet_of(
        [FakeOptions(), FakeOptions()],
        balance="round_robin",
        breaker_failures=2,
        breaker_cooldown=30,
    )
    bad = fleet.fakes[0]
    bad.faults.extend([503] * 50)  # answers its probes, fails every request
    for _ in range(8):
        assert await _text(fleet.backend, _chat())
    assert len(bad.bodies) == 2  # two failures eject it; the rest never reach it
    assert fleet.sample("llmso_replica_ejections_total", bad) == 1
    assert fleet.sample("llmso_replica_up", bad) == 0
    assert len(fleet.fakes[1].bodies) == 8


async def test_prefix_affinity_holds_under_bounded_load(fleet_of: Any) -> None:
    # The default load factor (1.5). 48 keys hash unevenly (the busiest replica owns
    # ~1.3x the mean); at 16 in flight the bound's noise floor (bounded_capacity) keeps
    # them home, where the plain ceil(1.5 * mean) spilled 6-13 % (docs/replicas.md).
    fleet = await fleet_of([FakeOptions(delay_ms=2)] * 4, balance="prefix")
    keys = [f"document {k:02d} " * 30 for k in range(48)]
    requests = [_chat(keys[i % len(keys)] + f"question {i}") for i in range(288)]
    await _burst(fleet.backend, requests, width=16)
    ring = PrefixAffinity([f"{fake.url}/v1" for fake in fleet.fakes], 1.5)
    home = {key: ring.primary(affinity_key(_chat(key + "question"), 256)) for key in keys}
    on_home = 0
    for replica, fake in enumerate(fleet.fakes):
        for body in fake.bodies:
            on_home += home[body["messages"][0]["content"][: len(keys[0])]] == replica
    assert on_home / len(requests) >= 0.9, (on_home, fleet.served())
    assert min(fleet.served()) > 0  # the keys spread over every replica


@pytest.mark.parametrize("width", [6, 24])
async def test_hot_prefix_spills_to_a_second_replica(fleet_of: Any, width: int) -> None:
    # At 6 in flight the noise floor lets home hold 5; at 24 the factor bounds it to 12.
    fleet = await fleet_of([FakeOptions(chunks=10, delay_ms=20)] * 3, balance="prefix")
    hot = "the same long system prompt " * 20
    total = 2 * width
    requests = [_chat(hot + str(i), max_tokens=10) for i in range(total)]
    await _burst(fleet.backend, requests, width=width)
    used = [n for n in fleet.served() if n]
    assert len(used) >= 2 and max(used) < total, fleet.served()
    spills = sum(
        fleet.sample("llmso_replica_routes_total", fake, balance="prefix", reason="spill")
        for fake in fleet.fakes
    )
    assert spills >= total - max(used)


async def test_session_and_user_keys_pin_a_replica(fleet_of: Any) -> None:
    fleet = await fleet_of([FakeOptions()] * 4, balance="prefix")
    for i in range(8):
        await _text(fleet.backend, _chat(f"turn {i}", session_id="conversation-7"))
    assert sorted(fleet.served()) == [0, 0, 0, 8]
    for i in range(8):
        await _text(fleet.backend, _chat(f"turn {i}", user="alice"))
    assert sum(1 for n in fleet.served() if n) <= 2


async def test_client_disconnect_aborts_on_the_serving_replica(fleet_of: Any) -> None:
    fleet = await fleet_of([FakeOptions(chunks=200, delay_ms=20)] * 2, balance="round_robin")
    await _text(fleet.backend, _chat(max_tokens=1))  # replica 0 once, so replica 1 is next
    stream = fleet.backend.generate(_chat(max_tokens=200))
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    serving = fleet.fakes[1]
    assert serving.running == 1
    await stream.aclose()  # type: ignore[attr-defined]
    await _until(lambda: serving.aborted == 1)
    assert serving.running == 0 and fleet.fakes[0].aborted == 0
    assert fleet.sample("llmso_replica_inflight_requests", serving) == 0


async def test_session_header_reaches_the_backend_through_the_app() -> None:
    fakes = [FakeUpstream(), FakeUpstream()]
    for fake in fakes:
        await fake.start()
    entry = {**_config(fakes, balance="prefix").model_dump(exclude_none=True), "name": "m"}
    app = build_app(AppConfig.model_validate({"models": [entry]}))
    try:
        async with app.lifespan():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await _until(app.state.registry.is_ready)
                for i in range(6):
                    body = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
                    reply = await client.post(
                        "/v1/chat/completions", json=body, headers={"x-session-id": "abc"}
                    )
                    assert reply.status_code == 200, reply.text
                assert sorted(len(f.bodies) for f in fakes) == [0, 6]
                assert all(
                    "x-session-id" not in {k.lower() for k in h} for f in fakes for h in f.headers
                )
                reply = await client.post(
                    "/v1/chat/completions", json=body, headers={"x-session-id": "x" * 300}
                )
                assert reply.status_code == 400
                assert reply.json()["error"]["param"] == "x-session-id"
    finally:
        for fake in fakes:
            await fake.stop()


async def test_two_gateways_behind_one_address_agree_on_replicas() -> None:
    """Gateways share no state: two apps with the same config, requests alternating
    between them as a Service would send them, pick the same replica per session key
    (the ring is a function of the config) and both serve."""
    fakes = [FakeUpstream(), FakeUpstream(), FakeUpstream()]
    for fake in fakes:
        await fake.start()
    entry = {**_config(fakes, balance="prefix").model_dump(exclude_none=True), "name": "m"}
    apps = [build_app(AppConfig.model_validate({"models": [entry]})) for _ in range(2)]
    try:
        async with apps[0].lifespan(), apps[1].lifespan():
            clients = [
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
                for app in apps
            ]
            for app in apps:
                await _until(app.state.registry.is_ready)
            for n in range(24):
                body = {"model": "m", "messages": [{"role": "user", "content": f"turn {n}"}]}
                headers = {"x-session-id": f"session-{n % 6}"}
                reply = await clients[n % 2].post(
                    "/v1/chat/completions", json=body, headers=headers
                )
                assert reply.status_code == 200, reply.text
            for client in clients:
                await client.aclose()
    finally:
        for fake in fakes:
            await fake.stop()
    homes: dict[int, set[int]] = {}
    for replica, fake in enumerate(fakes):
        for body in fake.bodies:
            turn = int(body["messages"][0]["content"].split()[1])
            homes.setdefault(turn % 6, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in homes.values()), homes
    assert len(homes) == 6
