"""Service tier for the console's JSON views and page: ``/admin/models`` detail,
``/admin/stats``, ``/admin/requests``, drain, the admin-key rules and ``server.ui``.

The whole app runs in-process over ASGI with the fake backend (which reports engine
steps and load through the app's own worker observer, as the hf engine does).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from backends.base import Backend
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app
from gateway.console.activity import Activity, percentile
from gateway.observe.record import RequestRecord
from tests.tools.fake_backend import FakeBackend

KEY = "console-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}


def app_config(ui: bool = True) -> AppConfig:
    models = [
        {"name": name, "backend": "openai", "base_url": "http://unused", "aliases": [f"{name}-a"]}
        for name in ("alpha", "beta")
    ]
    return AppConfig.model_validate({"server": {"ui": ui}, "models": models})


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[Any, httpx.AsyncClient]] = []

    async def make(config: AppConfig, admin_key: str | None = KEY) -> httpx.AsyncClient:
        holder: dict[str, Any] = {}

        def factory(model: ModelConfig, on_crash: Any) -> Backend:
            observer = holder["app"].state.backend_metrics.observer(model.name)
            return FakeBackend(model, observer, on_crash, delay=0.002)

        app = holder["app"] = build_app(config, admin_key=admin_key, backend_factory=factory)
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        await app.state.registry.start()  # wait for the preloads
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        opened.append((lifespan, client))
        return client

    yield make
    for lifespan, client in opened:
        await client.aclose()
        await lifespan.__aexit__(None, None, None)


async def chat(client: httpx.AsyncClient, text: str, model: str = "alpha") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return await client.post("/v1/chat/completions", json=body)


async def test_recent_requests_keep_timelines_but_never_text(
    client_for: Callable[..., Any],
) -> None:
    client = await client_for(app_config())
    assert (await chat(client, "one two three four")).status_code == 200
    assert (await chat(client, "secret words here", model="beta-a")).status_code == 200
    failed = await chat(client, "!error InvalidRequest messages no good")
    assert failed.status_code == 400
    assert (await chat(client, "hello", model="no-such-model")).status_code == 404
    tools = {"model": "beta", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}
    assert (await client.post("/v1/chat/completions", json=tools)).status_code == 400

    assert (await client.get("/admin/requests")).status_code == 401
    listing = (await client.get("/admin/requests", headers=AUTH)).json()["requests"]
    assert [r["model"] for r in listing] == ["beta", "no-such-model", "alpha", "beta", "alpha"]
    translated, refused, newest, second, oldest = listing  # newest first
    assert translated["status"] == "client_error" and translated["backend"] is None
    assert refused["status"] == "client_error" and refused["backend"] is None
    assert refused["error_type"] == "invalid_request_error" and refused["ttft_s"] is None
    assert newest["status"] == "client_error" and newest["error_type"] == "invalid_request_error"
    assert second["requested_model"] == "beta-a" and second["backend"] == "openai"
    assert oldest["output_tokens"] == 4 and oldest["status"] == "ok"
    assert 0 <= oldest["ttft_s"] <= oldest["e2e_s"]
    assert oldest["itl_s"] is not None and oldest["itl_s"] > 0
    assert oldest["arrival_time"] <= oldest["first_token_time"] <= oldest["finish_time"]
    assert "secret" not in str(listing) and "one two" not in str(listing)

    only_beta = await client.get("/admin/requests?model=beta", headers=AUTH)
    assert [r["status"] for r in only_beta.json()["requests"]] == ["client_error", "ok"]
    errors = await client.get("/admin/requests?status=client_error&limit=2", headers=AUTH)
    assert [r["model"] for r in errors.json()["requests"]] == ["beta", "no-such-model"]
    stats = (await client.get("/admin/stats", headers=AUTH)).json()["models"]
    assert set(stats) == {"alpha", "beta"} and stats["alpha"]["errors_4xx"] == 1
    bad = await client.get("/admin/requests?limit=0", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


async def test_stats_summarise_the_window_with_engine_gauges(
    client_for: Callable[..., Any],
) -> None:
    client = await client_for(app_config())
    empty = (await client.get("/admin/stats", headers=AUTH)).json()
    assert empty["window_s"] == 60
    assert empty["workers"] == 1 and 0 <= empty["loop_lag_s"] < 1.0
    assert empty["models"]["alpha"]["requests"] == 0
    assert empty["models"]["alpha"]["ttft_p50_s"] is None
    for _ in range(3):
        assert (await chat(client, "a b c d e")).status_code == 200
    assert (await chat(client, "!error UpstreamUnavailable - gone")).status_code == 503

    stats = (await client.get("/admin/stats", headers=AUTH)).json()
    alpha, beta = stats["models"]["alpha"], stats["models"]["beta"]
    assert alpha["requests"] == 4 and alpha["output_tokens"] == 15
    assert alpha["errors_5xx"] == 1 and alpha["errors_4xx"] == 0
    assert alpha["requests_per_s"] > 0 and alpha["output_tokens_per_s"] > 0
    assert 0 < alpha["ttft_p50_s"] <= alpha["ttft_p95_s"]
    assert 0 < alpha["itl_p50_s"] <= alpha["itl_p95_s"]
    assert sum(alpha["series"]["requests"]) == 4 and len(alpha["series"]["requests"]) == 60
    assert sum(alpha["series"]["output_tokens"]) == 15
    assert sum(alpha["series"]["errors"]) == 1
    # The fake engine reported one sequence per step and its load through the observer.
    assert alpha["batch_size_mean"] == 1.0
    assert alpha["running"] == 0 and alpha["kv_cache_usage"] == 0.0
    assert alpha["state"] == "ready" and alpha["inflight"] == 0
    assert beta["requests"] == 0 and beta["batch_size_mean"] is None


async def test_admin_models_detail_and_drain(client_for: Callable[..., Any]) -> None:
    client = await client_for(app_config())
    assert (await chat(client, "warm up")).status_code == 200
    body = (await client.get("/admin/models", headers=AUTH)).json()
    assert body["mutations"] is True
    alpha = {m["name"]: m for m in body["models"]}["alpha"]
    assert alpha["state"] == "ready" and alpha["aliases"] == ["alpha-a"]
    assert alpha["loaded_at"] is not None and alpha["last_used"] >= alpha["loaded_at"]
    assert alpha["queue_depth"] == 0 and alpha["running"] == 0 and alpha["inflight"] == 0

    assert (await client.post("/admin/models/alpha/drain")).status_code == 401
    drained = await client.post("/admin/models/alpha/drain", headers=AUTH)
    assert drained.json()["state"] in {"draining", "unloaded"}
    # The drain runs in the background; unload joins it.
    unloaded = await client.post("/admin/models/alpha/unload", headers=AUTH)
    assert unloaded.json()["state"] == "unloaded"
    missing = await client.post("/admin/models/nope/drain", headers=AUTH)
    assert missing.status_code == 404


async def test_without_an_admin_key_views_are_open_and_mutations_absent(
    client_for: Callable[..., Any],
) -> None:
    client = await client_for(app_config(), admin_key=None)
    models = await client.get("/admin/models")
    assert models.status_code == 200 and models.json()["mutations"] is False
    assert (await client.get("/admin/stats")).status_code == 200
    assert (await client.get("/admin/requests")).status_code == 200
    for action in ("load", "unload", "drain"):
        response = await client.post(f"/admin/models/alpha/{action}")
        assert response.status_code == 404, action


async def test_the_page_is_served_from_the_package_unless_turned_off(
    client_for: Callable[..., Any],
) -> None:
    client = await client_for(app_config())
    redirect = await client.get("/ui")
    assert redirect.status_code == 308 and redirect.headers["location"] == "/ui/"
    page = await client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert '<script type="module" src="app.js"></script>' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing off-box
    script = await client.get("/ui/app.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert (await client.get("/ui/../app.py")).status_code == 404
    assert (await client.get("/ui/nope.js")).status_code == 404

    off = await client_for(app_config(ui=False))
    assert (await off.get("/ui/")).status_code == 404
    assert (await off.get("/admin/stats", headers=AUTH)).status_code == 200


def test_window_drops_old_samples_and_the_ring_keeps_the_newest() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([0.0, 10.0], 0.95) == pytest.approx(9.5)
    activity = Activity(window_seconds=60, capacity=2)
    for number in range(3):
        record = RequestRecord(request_id=f"r{number}", requested_model="m", model="m")
        record.output_tokens = 10
        record.finish()
        activity.add(record)
    assert [s.request_id for s in activity.recent()] == ["r2", "r1"]
    now = time.monotonic()
    assert activity.summary("m", now=now)["requests"] == 3
    assert activity.summary("m", now=now + 61)["requests"] == 0
    assert activity.models() == []
