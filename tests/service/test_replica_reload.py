"""Hot reload of a replica list through the real path: a config file, the app's
``ConfigWatcher``, ``ModelRegistry.apply_config``, the lifecycle, and the running openai
backend's ``ReplicaSet`` (fake upstreams stand in for the engines).

A change to ``replicas`` (or balance fields) keeps the running backend: the added
replica takes requests, the removed one gets no new ones while its in-flight stream
finishes whole, then its metric children go. Any other change still restarts the model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.fake_upstream import FakeOptions, FakeUpstream
from config.loader import load_config
from gateway.app import build_app

MODEL = "m"


def _write(path: Path, fakes: list[FakeUpstream], **fields: Any) -> None:
    model = {
        "name": MODEL,
        "backend": "openai",
        "replicas": [f"{fake.url}/v1" for fake in fakes],
        "upstream_model": "fake-model",
        "balance": "round_robin",
        "health_interval": 0.1,
        "connect_timeout": 1.0,
        "metrics_scrape_interval": 0.1,
        **fields,
    }
    path.write_text(yaml.safe_dump({"models": [model]}))


async def _until(predicate: Any, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def _backend(app: Any) -> Any:
    async with app.state.registry.lease(MODEL) as lease:
        return lease.backend


async def test_replica_list_reloads_in_place_and_removed_replica_drains(tmp_path: Path) -> None:
    slow = FakeUpstream(FakeOptions(chunks=60, delay_ms=50))  # a 3 s stream
    kept, added = FakeUpstream(), FakeUpstream()
    for fake in (slow, kept, added):
        await fake.start()
    path = tmp_path / "llmso.yaml"
    _write(path, [slow, kept])
    app = build_app(load_config(path), watch_config=True)
    prometheus = app.state.prometheus
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}
    try:
        async with app.lifespan():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                await _until(app.state.registry.is_ready)
                backend = await _backend(app)
                # In flight on the slow replica (round robin's first pick) during the reload.
                long = asyncio.create_task(client.post("/v1/chat/completions", json=chat))
                await _until(lambda: slow.running == 1)
                _write(path, [kept, added])  # the watcher polls every second
                await _until(
                    lambda: (
                        [r["url"] for r in backend.replica_status()]
                        == [f"{kept.url}/v1", f"{added.url}/v1"]
                    )
                )
                assert await _backend(app) is backend  # not restarted
                # The new replica joins once its first probe (sent at once) passes.
                await _until(lambda: all(r["up"] for r in backend.replica_status()), within=2.0)
                (listed,) = (await client.get("/admin/models")).json()["models"]
                assert [(r["url"], r["up"], r["ejected"]) for r in listed["replicas"]] == [
                    (f"{kept.url}/v1", True, False),
                    (f"{added.url}/v1", True, False),
                ]
                for _ in range(6):
                    short = {**chat, "max_tokens": 2}
                    reply = await client.post("/v1/chat/completions", json=short)
                    assert reply.status_code == 200, reply.text
                assert slow.running == 1 and not long.done()  # still running, nothing new
                reply = await long
                assert reply.status_code == 200, reply.text
                assert reply.json()["usage"]["completion_tokens"] == 60
                assert (len(slow.bodies), slow.aborted, slow.completed) == (1, 0, 1)
                assert len(kept.bodies) == 3 and len(added.bodies) == 3
                gone = {"model": MODEL, "replica": f"{slow.url}/v1"}
                await _until(lambda: prometheus.get_sample_value("llmso_replica_up", gone) is None)
                loads = {"model": MODEL, "result": "success"}
                assert prometheus.get_sample_value("llmso_model_loads_total", loads) == 1
                # Any other field still restarts the model (a new backend).
                _write(path, [kept, added], retries=1)
                await _until(lambda: app.state.registry.is_ready() and _is_new(app, backend))
    finally:
        for fake in (slow, kept, added):
            await fake.stop()


def _is_new(app: Any, old: Any) -> bool:
    entry = app.state.registry._life.entry(MODEL)
    return entry is not None and entry.instance is not None and entry.instance.backend is not old
