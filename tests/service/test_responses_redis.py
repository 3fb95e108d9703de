"""The Redis response store against a real ``redis-server``: entries with a TTL, and two
gateway apps (two replicas) continuing each other's conversations through it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis

from config.schema import AppConfig
from gateway.api.responses.redis_store import KEY_PREFIX, RedisResponseStore
from gateway.api.responses.store import StoredResponse
from gateway.app import build_app
from tests.tools.schemas import validate
from tests.tools.scripted_responses import ScriptedBackend, scripted_factory
from tests.tools.servers import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if not os.path.exists(REDIS_SERVER):
        reason = "redis-server is not installed (apt-get install redis-server)"
        if os.environ.get("LLMSO_REQUIRE_ENGINES") == "1":
            raise RuntimeError(reason)
        pytest.skip(reason)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="llmso-redis-") as folder:
        argv = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", folder]
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            _wait_for(port, process)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    client = redis.Redis(port=port, socket_timeout=1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {process.returncode}")
        with contextlib.suppress(redis.RedisError):
            if client.ping():
                return
        time.sleep(0.1)
    raise TimeoutError("redis-server did not answer PING")


async def test_entries_round_trip_with_a_ttl(redis_url: str) -> None:
    store = RedisResponseStore(redis_url, ttl=0.5, timeout=2.0)
    entry = StoredResponse({"id": "resp_1", "output": []}, [{"role": "user", "content": "é"}])
    try:
        await store.put("resp_1", entry)
        assert await store.get("resp_1") == entry
        ttl_ms = redis.Redis.from_url(redis_url).pttl(KEY_PREFIX + "resp_1")
        assert 0 < ttl_ms <= 500
        assert await store.delete("resp_1") is True
        assert await store.get("resp_1") is None and await store.delete("resp_1") is False
        await store.put("resp_2", entry)
        await asyncio.sleep(0.8)
        assert await store.get("resp_2") is None  # expired by Redis itself
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def replica(store: str) -> AsyncIterator[httpx.AsyncClient]:
    models = [{"name": "alpha", "backend": "openai", "base_url": "http://unused"}]
    config = AppConfig.model_validate({"models": models, "responses": {"store": store}})
    backends: dict[str, ScriptedBackend] = {}
    app = build_app(config, backend_factory=scripted_factory(backends))
    transport = httpx.ASGITransport(app=app)
    async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        c.backends = backends  # type: ignore[attr-defined]
        yield c


async def test_two_replicas_share_conversations(redis_url: str) -> None:
    async with replica(redis_url) as one, replica(redis_url) as two:
        first = await one.post("/v1/responses", json={"model": "alpha", "input": "turn one"})
        assert first.status_code == 200, first.text
        first_id = first.json()["id"]
        body = {"model": "alpha", "input": "turn two", "previous_response_id": first_id}
        second = await two.post("/v1/responses", json=body)
        assert second.status_code == 200, second.text
        validate("Response", second.json())
        request = two.backends["alpha"].calls[-1]  # type: ignore[attr-defined]
        assert [m.content for m in request.messages] == ["turn one", "turn one", "turn two"]
        assert (await two.get(f"/v1/responses/{first_id}")).json() == first.json()
        assert (await two.delete(f"/v1/responses/{first_id}")).status_code == 200
        assert (await one.get(f"/v1/responses/{first_id}")).status_code == 404


async def test_unreachable_store_is_a_503_not_a_hang() -> None:
    async with replica(f"redis://127.0.0.1:{free_port()}/0") as client:
        body = {"model": "alpha", "input": "x", "previous_response_id": "resp_x"}
        response = await client.post("/v1/responses", json=body)
        assert response.status_code == 503
        validate("ErrorResponse", response.json())
        assert response.json()["error"]["code"] == "response_store_unavailable"
        assert response.headers["retry-after"] == "1"


async def test_the_store_outlives_a_redis_restart() -> None:
    """Pooled connections from before a restart are dead: the next call on each must
    still succeed (the soak met them as 503s seconds after Redis was back)."""
    from tests.tools.redis_server import RedisServer

    server = RedisServer(free_port())
    server.start()
    store = RedisResponseStore(server.url, ttl=60, timeout=2)
    entry = StoredResponse(response={"id": "resp_0"}, items=[{"role": "user", "content": "hi"}])
    try:
        # Several connections in the pool, each idle across the restart.
        await asyncio.gather(*(store.put(f"resp_{n}", entry) for n in range(4)))
        server.kill()
        server.start()
        found = await asyncio.gather(*(store.get(f"resp_{n}") for n in range(4)))
        assert found == [None] * 4  # a restart without persistence lost them, cleanly
        await asyncio.gather(*(store.put(f"resp_{n}", entry) for n in range(4)))
        assert await store.get("resp_0") == entry
    finally:
        await store.close()
        server.kill()
