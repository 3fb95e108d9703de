"""LoRA adapters through ``llmso serve`` (backend: openai) over two real vLLM-CPU
replicas: requests for an adapter land on the replica that lists it, an adapter no
replica has is loaded once (``/v1/load_lora_adapter``) on one replica and served there
from then on, an adapter's greedy answer differs from the base model's, and the base
model still answers.

Replica A starts with ``--lora-modules a1=<path>``, replica B with none; both run
``--enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (without it vLLM has no
load route). The adapters are random PEFT adapters of SmolLM2 made here.

Needs ``make vllm``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.tools.engines import model_folder, require_engine, start_together, start_vllm
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("vllm"), pytest.mark.slow]

MODEL = "smollm2-lora"
PROMPT = "The capital of France is"
LORA_FLAGS = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16")
LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
ADMIN_KEY = "adm-lora-0123456789"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("peft")
    from tests.tools.lora_adapters import random_adapter

    folder = tmp_path_factory.mktemp("lora")
    base = model_folder()
    # Rank 8 on two projections, B not zero: a visible change to greedy answers
    # (0.1 moved "Paris." to other words on vLLM-CPU 0.32 in a trial).
    return {
        name: random_adapter(
            base, folder / name, ["q_proj", "v_proj"], rank=8, seed=seed, scale=0.1
        )
        for seed, name in enumerate(("a1", "a2"), start=1)
    }


@pytest.fixture(scope="module")
def engines(adapters: dict[str, Path]) -> Iterator[list[RunningServer]]:
    require_engine("vllm")
    with_a1 = (*LORA_FLAGS, "--lora-modules", f"a1={adapters['a1']}")
    with start_together(
        start_vllm(MODEL, max_model_len=512, flags=with_a1, env=LORA_ENV),
        start_vllm(MODEL, max_model_len=512, flags=LORA_FLAGS, env=LORA_ENV),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def server(engines: list[RunningServer], adapters: dict[str, Path]) -> Iterator[RunningServer]:
    model = {
        "name": MODEL,
        "backend": "openai",
        "engine": "vllm",
        "upstream_model": MODEL,
        "replicas": [f"{engine.url}/v1" for engine in engines],
        "balance": "round_robin",
        "health_interval": 1.0,
        "first_token_timeout": 120.0,
        "adapters": [{"name": name, "source": str(path)} for name, path in adapters.items()],
    }
    with gateway({"models": [model]}, env={"LLMSO_ADMIN_KEY": ADMIN_KEY}) as running:
        yield running


def _complete(server: RunningServer, model: str) -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    reply = httpx.post(server.url + "/v1/completions", json=body, timeout=180)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["text"])


def _sum(page: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") and all(label in line for label in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _served(engines: list[RunningServer]) -> list[float]:
    """Requests each vLLM replica finished, by its own /metrics."""
    pages = [httpx.get(engine.url + "/metrics", timeout=10).text for engine in engines]
    return [_sum(page, "vllm:request_success_total") for page in pages]


def _listed(engine: RunningServer) -> set[str]:
    models = httpx.get(engine.url + "/v1/models", timeout=10).json()["data"]
    return {m["id"] for m in models if m.get("parent")}


def _gateway_metrics(server: RunningServer) -> str:
    return httpx.get(server.url + "/metrics", timeout=10).text


def test_a_listed_adapter_lands_on_its_replica(
    server: RunningServer, engines: list[RunningServer]
) -> None:
    first, second = engines
    before = _served(engines)
    for _ in range(3):
        _complete(server, "a1")
    after = _served(engines)
    assert (after[0] - before[0], after[1] - before[1]) == (3, 0)
    page = _gateway_metrics(server)
    assert (
        _sum(page, "llmso_replica_routes_total", replica=f"{first.url}/v1", reason="adapter") == 3
    )
    assert (
        _sum(page, "llmso_replica_routes_total", replica=f"{second.url}/v1", reason="adapter") == 0
    )
    models = httpx.get(server.url + "/admin/models", headers=ADMIN, timeout=10).json()["models"]
    listed = models[0]["replicas"]
    assert [r["adapters"] for r in listed] == [["a1"], []]


def test_an_adapter_no_replica_has_is_loaded_once_then_served_there(
    server: RunningServer, engines: list[RunningServer]
) -> None:
    before = _served(engines)
    with ThreadPoolExecutor(3) as pool:  # three at once: they share one load
        list(pool.map(lambda _: _complete(server, "a2"), range(3)))
    page = _gateway_metrics(server)
    assert _sum(page, "llmso_adapter_loads_total") == 1
    loaded = [i for i, engine in enumerate(engines) if "a2" in _listed(engine)]
    assert len(loaded) == 1
    holder = loaded[0]
    ok = _sum(page, "llmso_adapter_loads_total", replica=f"{engines[holder].url}/v1", outcome="ok")
    assert ok == 1
    _complete(server, "a2")
    after = _served(engines)
    assert [after[i] - before[i] for i in range(2)] == [4 if i == holder else 0 for i in range(2)]
    assert _sum(_gateway_metrics(server), "llmso_adapter_loads_total") == 1


def test_adapters_change_the_answer_and_the_base_still_answers(server: RunningServer) -> None:
    base, first, second = (_complete(server, model) for model in (MODEL, "a1", "a2"))
    assert base.strip()
    assert base not in (first, second)


def test_an_adapter_registered_at_run_time_loads_where_needed_and_unloads(
    server: RunningServer, engines: list[RunningServer], adapters: dict[str, Path]
) -> None:
    """vLLM's own route shape on the gateway registers ``a3`` (admin key); its first
    request loads it on one replica; unregistering it unloads it there and its name
    stops routing."""
    loads = _sum(_gateway_metrics(server), "llmso_adapter_loads_total")
    body = {"lora_name": "a3", "lora_path": str(adapters["a2"])}
    added = httpx.post(server.url + "/v1/load_lora_adapter", json=body, headers=ADMIN, timeout=30)
    assert added.status_code == 200, added.text
    assert _complete(server, "a3").strip()
    assert _sum(_gateway_metrics(server), "llmso_adapter_loads_total") == loads + 1
    assert sum("a3" in _listed(engine) for engine in engines) == 1
    removed = httpx.delete(
        server.url + f"/admin/models/{MODEL}/adapters/a3", headers=ADMIN, timeout=30
    )
    assert removed.status_code == 200, removed.text
    assert not any("a3" in _listed(engine) for engine in engines)
    request = {"model": "a3", "prompt": PROMPT, "max_tokens": 2}
    gone = httpx.post(server.url + "/v1/completions", json=request, timeout=30)
    assert gone.status_code == 404, gone.text
