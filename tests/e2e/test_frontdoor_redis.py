"""Limits shared across replicas: a real ``redis-server``, two ``llmso serve`` processes
in front of one fake upstream, one client key.

- the Redis store's Lua script decides like the in-process arithmetic;
- a combined burst over both gateways gets exactly the key's rpm through (±1);
- Redis killed mid-run: the ``allow`` gateway keeps serving, the ``deny`` one answers
  503, nothing hangs, and both enforce limits again once Redis is back;
- the logs of the whole run contain neither the keys nor the prompts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.access.limits import Ask, KeyLimits, MemoryStore, Settlement
from gateway.access.redis_store import RedisStore
from tests.tools.engines import proxy_config, start_fake_upstream
from tests.tools.redis_server import RedisServer, redis_missing, redis_server
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_missing = redis_missing()
if _missing:
    pytest.skip(_missing, allow_module_level=True)

MODEL = "fake-proxy"
KEY_BURST = "sk-burst-" + uuid.uuid4().hex
KEY_KILL = "sk-kill-" + uuid.uuid4().hex
PROMPT = "prompt-marker-" + uuid.uuid4().hex
RPM = 10


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def gateway_config(upstream: RunningServer, redis: RedisServer, policy: str) -> dict[str, Any]:
    config = proxy_config(MODEL, upstream, "generic", "up-model")
    config["auth"] = {
        "required": True,
        "keys": [
            {"name": "burst", "key": "${E2E_KEY_BURST}", "rpm": RPM},
            {"name": "kill", "key": "${E2E_KEY_KILL}", "rpm": 1000, "tpm": 100000},
        ],
    }
    config["limits"] = {
        "store": redis.url,
        "on_store_error": policy,
        "store_timeout": 0.5,
        "retry_interval": 0.5,
    }
    return config


@pytest.fixture(scope="module")
def gateways(redis: RedisServer) -> Iterator[tuple[RunningServer, RunningServer]]:
    env = {"E2E_KEY_BURST": KEY_BURST, "E2E_KEY_KILL": KEY_KILL}
    with (
        start_fake_upstream("--chunks", "4", "--model", "up-model") as upstream,
        gateway(gateway_config(upstream, redis, "allow"), env=env) as allow,
        gateway(gateway_config(upstream, redis, "deny"), env=env) as deny,
    ):
        yield allow, deny


async def _post(client: httpx.AsyncClient, url: str, key: str) -> int:
    response = await client.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2},
        headers={"authorization": f"Bearer {key}"},
    )
    return response.status_code


async def test_redis_store_decides_like_the_memory_store(redis: RedisServer) -> None:
    store = RedisStore(redis.url, prefix="parity", lease_ttl=60.0, timeout=2.0)
    memory = MemoryStore(lease_ttl=60.0)
    limits = KeyLimits(rpm=5, tpm=300, max_parallel=3, tokens_per_day=1000)
    try:
        for lease, cost in enumerate([100, 100, 50, 200, 10, 10, 10]):
            ask = Ask("k", limits, cost, f"lease-{lease}")
            shared, local = await store.admit(ask), await memory.admit(ask)
            assert (shared.allowed, shared.reason) == (local.allowed, local.reason), lease
            assert shared.requests is not None and local.requests is not None
            assert abs(shared.requests.remaining - local.requests.remaining) <= 1
            if shared.allowed and lease % 2 == 0:
                settle = Settlement("k", limits, ask.lease, shared.day, -cost // 2)
                await store.settle(settle)
                await memory.settle(settle)
        peeked = await store.peek("k", limits)
        local_peek = await memory.peek("k", limits)
        assert peeked.inflight == local_peek.inflight
        assert peeked.day_used == local_peek.day_used
        assert peeked.tokens is not None and local_peek.tokens is not None
        assert abs(peeked.tokens.remaining - local_peek.tokens.remaining) <= 2
    finally:
        await store.close()


async def test_two_gateways_share_one_rpm(gateways: tuple[RunningServer, RunningServer]) -> None:
    allow, deny = gateways
    async with httpx.AsyncClient(timeout=30) as client:
        calls = [_post(client, server.url, KEY_BURST) for server in (allow, deny) * RPM]
        statuses = await asyncio.gather(*calls)
    assert set(statuses) <= {200, 429}
    assert abs(statuses.count(200) - RPM) <= 1, statuses
    assert statuses.count(429) >= RPM - 1


async def test_redis_killed_then_back(
    redis: RedisServer, gateways: tuple[RunningServer, RunningServer]
) -> None:
    allow, deny = gateways
    async with httpx.AsyncClient(timeout=30) as client:
        assert await _post(client, allow.url, KEY_KILL) == 200
        redis.kill()
        began = time.monotonic()
        down_allow = [await _post(client, allow.url, KEY_KILL) for _ in range(3)]
        down_deny = [await _post(client, deny.url, KEY_KILL) for _ in range(3)]
        assert down_allow == [200] * 3
        assert down_deny == [503] * 3
        assert time.monotonic() - began < 15  # each waits at most one store timeout
        metrics = (await client.get(allow.url + "/metrics")).text
        assert "llmso_limit_store_up 0.0" in metrics
        redis.start()
        for _ in range(60):
            if await _post(client, deny.url, KEY_KILL) == 200:
                break
            await asyncio.sleep(0.25)
        else:
            pytest.fail("the deny gateway did not recover after Redis came back")
        response = await client.post(
            allow.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]},
            headers={"authorization": f"Bearer {KEY_KILL}"},
        )
        assert response.status_code == 200
        assert response.headers["x-ratelimit-limit-requests"] == "1000"  # enforced again
        # No max_tokens: limits.unset_max_tokens (1024) is reserved, then settled.
        assert int(response.headers["x-ratelimit-remaining-tokens"]) < 100000 - 1024


def test_logs_of_the_run_hold_no_keys_or_prompts(
    gateways: tuple[RunningServer, RunningServer],
) -> None:
    for server in gateways:
        text = server.log_path.read_text(errors="replace")
        assert "request_finished" in text  # the request log is there
        for secret in (KEY_BURST, KEY_KILL, PROMPT, KEY_BURST[9:25], PROMPT[14:30]):
            assert secret not in text, f"{secret[:12]}... found in {server.log_path}"
