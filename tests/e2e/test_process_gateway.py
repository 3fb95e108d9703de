"""End to end: `llmso serve` with an `isolation: process` model whose worker runs the
FakeBackend. A `kill -9` of the worker mid-stream must end the SSE stream with one error
event and `[DONE]`, the registry must restart the worker, and stopping the gateway must
leave no worker behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "fake-isolated"


def worker_pids(gateway_pid: int) -> list[int]:
    """Live worker processes whose parent is the gateway."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            state, ppid = fields[0], int(fields[1])
            cmdline = (entry / "cmdline").read_bytes()
            if ppid == gateway_pid and state != "Z" and b"backends.process.worker" in cmdline:
                found.append(int(entry.name))
    return found


def pid_gone(pid: int) -> bool:
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def wait_for(predicate: object, limit_s: float) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "backend": "hf",
                "source": "unused-by-the-fake",
                "isolation": "process",
                "memory_bytes": 1000,
                "load_timeout": 30,
            }
        ]
    }
    env = {
        "LLMSO_WORKER_BACKEND": "tests.tools.fake_backend:FakeBackend",
        "LLMSO_FAKE_DELAY": "0.02",
    }
    with gateway(config, env=env, timeout=60) as running:
        yield running


def complete(server: RunningServer, prompt: str) -> str:
    response = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 50},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    return text


def test_requests_are_served_by_the_worker(server: RunningServer) -> None:
    assert len(worker_pids(server.process.pid)) == 1
    assert complete(server, "served from a worker") == "served from a worker"


def test_kill_9_mid_stream_ends_the_stream_and_the_model_restarts(server: RunningServer) -> None:
    [pid] = worker_pids(server.process.pid)
    body = {"model": MODEL, "prompt": "w " * 400, "max_tokens": 400, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            if len(events) == 3:
                os.kill(pid, signal.SIGKILL)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert error["error"]["code"] == "backend_crashed", error
    assert "SIGKILL" in error["error"]["message"]
    assert sum("error" in json.loads(e) for e in events[:-1]) == 1
    assert len(events) < 100  # the stream ended at the crash, not after 400 tokens

    # The registry restarts the model (backoff ~1 s) in a fresh worker.
    assert wait_for(lambda: worker_pids(server.process.pid) not in ([], [pid]), 20)
    assert wait_for(lambda: _served(server), 20), server.log_tail()
    assert complete(server, "alive again") == "alive again"


def _served(server: RunningServer) -> bool:
    response = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": "ping", "max_tokens": 5},
        timeout=30,
    )
    return response.status_code == 200


def test_stopping_the_gateway_leaves_no_worker() -> None:
    config = {
        "models": [
            {"name": MODEL, "backend": "hf", "source": "x", "isolation": "process",
             "memory_bytes": 1000, "load_timeout": 30}
        ]
    }  # fmt: skip
    env = {"LLMSO_WORKER_BACKEND": "tests.tools.fake_backend:FakeBackend"}
    with gateway(config, env=env, timeout=60) as running:
        [pid] = worker_pids(running.process.pid)
        # A plain SIGTERM to the gateway alone (not its group): it must stop its worker.
        running.process.send_signal(signal.SIGTERM)
        running.process.wait(20)
        assert wait_for(lambda: pid_gone(pid), 5)
