"""The registry through the whole app over ASGI: lazy loads and Retry-After, fallback when a
model cannot load, capability routing, admin load/unload, eviction and hot reload."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from config.loader import load_config
from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.registry_fakes import FakeFactory, app_config, fake_model

ADMIN = {"authorization": "Bearer registry-admin"}

Client = tuple[httpx.AsyncClient, FakeFactory]


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[Any, httpx.AsyncClient]] = []

    async def make(config: AppConfig, *, watch: bool = False) -> Client:
        factory = FakeFactory()
        app = build_app(
            config, admin_key="registry-admin", backend_factory=factory, watch_config=watch
        )
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        opened.append((lifespan, client))
        return client, factory

    yield make
    for lifespan, client in opened:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


async def chat(client: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return await client.post("/v1/chat/completions", json=body)


async def admin_models(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await client.get("/admin/models", headers=ADMIN)
    assert response.status_code == 200, response.text
    return {m["name"]: m for m in response.json()["models"]}


async def test_lazy_load_single_flight_over_http(client_for: Callable[..., Any]) -> None:
    client, factory = await client_for(app_config(fake_model("lazy")))
    factory.plan("lazy").load_seconds = 0.05
    responses = await asyncio.gather(*(chat(client, "lazy") for _ in range(8)))
    assert [r.status_code for r in responses] == [200] * 8
    assert {r.json()["model"] for r in responses} == {"lazy"}
    assert factory.plan("lazy").starts == 1


async def test_slow_load_answers_503_with_retry_after(client_for: Callable[..., Any]) -> None:
    client, factory = await client_for(app_config(fake_model("slow", load_timeout=0.1)))
    factory.plan("slow").load_seconds = 1.0
    response = await chat(client, "slow")
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "model_not_ready"
    assert int(response.headers["retry-after"]) >= 1
    models = await admin_models(client)
    assert models["slow"]["state"] == "failed"
    assert "timed out" in models["slow"]["last_error"]


async def test_unknown_model_is_404(client_for: Callable[..., Any]) -> None:
    client, _ = await client_for(app_config(fake_model("only")))
    response = await chat(client, "missing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


async def test_fallback_when_a_model_cannot_load(client_for: Callable[..., Any]) -> None:
    config = app_config(fake_model("primary", fallback=["spare"]), fake_model("spare"))
    client, factory = await client_for(config)
    factory.plan("primary").fail_starts = 5
    response = await chat(client, "primary")
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "spare"
    metrics = (await client.get("/metrics")).text
    assert 'llmso_route_decisions_total{reason="fallback"} 1.0' in metrics
    assert 'llmso_model_loads_total{model="primary",result="failure"} 1.0' in metrics


async def test_capability_routing_over_http(client_for: Callable[..., Any]) -> None:
    config = app_config(
        fake_model("fast", capabilities=["small"], priority=1),
        fake_model("better", capabilities=["small"], priority=5),
    )
    client, _ = await client_for(config)
    response = await chat(client, "capability:small")
    assert response.status_code == 200 and response.json()["model"] == "better"


async def test_admin_load_unload_and_eviction(client_for: Callable[..., Any]) -> None:
    config = app_config(
        fake_model("one", memory_bytes=60), fake_model("two", memory_bytes=60), budget=100
    )
    client, factory = await client_for(config)
    loaded = await client.post("/admin/models/one/load", headers=ADMIN)
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready"
    assert loaded.json()["pid"] == factory.last("one").pid
    assert (await chat(client, "two")).json()["model"] == "two"  # evicts one (LRU)
    models = await admin_models(client)
    assert (models["one"]["state"], models["two"]["state"]) == ("unloaded", "ready")
    unloaded = await client.post("/admin/models/two/unload", headers=ADMIN)
    assert unloaded.json()["state"] == "unloaded" and factory.last("two").stopped
    metrics = (await client.get("/metrics")).text
    assert 'llmso_model_evictions_total{model="one",reason="memory"} 1.0' in metrics
    assert 'llmso_model_state{model="two",state="unloaded"} 1.0' in metrics


async def test_hot_reload_from_file(client_for: Callable[..., Any], tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [fake_model("old", preload=True)]}))
    client, _ = await client_for(load_config(path), watch=True)
    assert (await chat(client, "old")).status_code == 200
    path.write_text(yaml.safe_dump({"models": [fake_model("new", preload=True)]}))

    async def names() -> set[str]:
        return {m["id"] for m in (await client.get("/v1/models")).json()["data"]}

    for _ in range(50):  # the watcher polls the file about once a second
        if await names() == {"new"}:
            break
        await asyncio.sleep(0.1)
    assert await names() == {"new"}
    assert (await chat(client, "old")).status_code == 404
    assert (await chat(client, "new")).json()["model"] == "new"
