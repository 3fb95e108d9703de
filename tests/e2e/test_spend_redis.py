"""Spend budgets shared across replicas: a real ``redis-server``, two ``llmso serve``
processes in front of one fake upstream, one priced model and a key with a budget.

- the Lua calendar of the Redis store names the same UTC periods as Python's, day by day;
- the Redis store decides and charges budgets like the in-process store;
- a key with a budget is refused once it is spent, across the two gateways, with 429
  ``budget_exceeded`` and ``Retry-After`` at the period's end, on both of them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from redis import Redis

from gateway.access.limits import Ask, KeyLimits, MemoryStore, Settlement
from gateway.access.periods import CALENDAR_LUA, DAY, bounds
from gateway.access.redis_store import RedisStore
from gateway.observe.cost import pico_of_usd
from tests.tools.engines import proxy_config, start_fake_upstream
from tests.tools.redis_server import RedisServer, redis_missing, redis_server
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

_missing = redis_missing()
if _missing:
    pytest.skip(_missing, allow_module_level=True)

MODEL = "priced-proxy"
KEY = "sk-spend-" + uuid.uuid4().hex
ADMIN = "admin-" + uuid.uuid4().hex
# Output only, so an answer's cost does not depend on how the upstream counts the prompt:
# 2 completion tokens x 1000 USD per million = 0.002 USD an answer.
PRICES = {"input": 0.0, "output": 1000.0}
ONE_ANSWER = 0.002
BUDGET = 0.007  # spent 0, .002, .004, .006 when admitted: four answers, then refused
PREFIX = "spend-" + uuid.uuid4().hex[:8]  # the two gateways' one budget in Redis


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def test_the_lua_calendar_names_the_periods_python_does(redis: RedisServer) -> None:
    client = Redis.from_url(redis.url)
    script = client.register_script(
        CALENDAR_LUA + "local a, b = period_bounds(tonumber(ARGV[1]), ARGV[2]) return {a, b}"
    )
    start = int(time.time() // DAY) - 400
    # Every day of two years around now, and the centuries' leap rules.
    days = [*range(start, start + 800), *range(10957 - 40, 10957 + 40)]  # 2000-01-01
    days += [*range(47482 - 40, 47482 + 40), 0, 1, 58, 59, 60]  # 2100-01-01; 1970
    try:
        for day in days:
            for kind in ("day", "week", "month"):
                assert script(args=[day, kind]) == list(bounds(day * DAY + 1, kind)), (day, kind)
    finally:
        client.close()


async def test_redis_store_budgets_like_the_memory_store(redis: RedisServer) -> None:
    store = RedisStore(redis.url, prefix="spend-parity", lease_ttl=60.0, timeout=2.0)
    memory = MemoryStore(lease_ttl=60.0)
    limits = KeyLimits(max_budget=pico_of_usd(0.01), budget_period="week")
    try:
        for lease, cost in enumerate([0, 4, 3, 2, 5, 1]):
            ask = Ask("k", limits, 10, f"lease-{lease}")
            shared, local = await store.admit(ask), await memory.admit(ask)
            assert (shared.allowed, shared.reason) == (local.allowed, local.reason), lease
            assert shared.spent == local.spent, lease
            assert (
                shared.budget_resets_at
                == local.budget_resets_at
                == bounds(time.time(), "week")[1] * DAY
            )
            if shared.allowed:
                settle = Settlement("k", limits, ask.lease, shared.day, 0, pico_of_usd(cost / 1000))
                await store.settle(settle)
                await memory.settle(settle)
        peeked, local_peek = await store.peek("k", limits), await memory.peek("k", limits)
        # 4 + 3 + 2 + 5 thousandths: the last admission (at 0.009) overshot the 0.01.
        assert peeked.spent == local_peek.spent == pico_of_usd(0.014)
        assert not (await store.admit(Ask("k", limits, 1, "last"))).allowed
    finally:
        await store.close()


def gateway_config(upstream: RunningServer, redis: RedisServer) -> dict[str, Any]:
    config = proxy_config(MODEL, upstream, "generic", "up-model", pricing=PRICES)
    config["auth"] = {
        "required": True,
        "keys": [
            {"name": "spender", "key": "${E2E_KEY_SPEND}", "max_budget": BUDGET},
        ],
    }
    config["limits"] = {"store": redis.url, "prefix": PREFIX}
    return config


@pytest.fixture(scope="module")
def gateways(redis: RedisServer) -> Iterator[tuple[RunningServer, RunningServer]]:
    env = {"E2E_KEY_SPEND": KEY, "LLMSO_ADMIN_KEY": ADMIN}
    with (
        start_fake_upstream("--chunks", "4", "--model", "up-model") as upstream,
        gateway(gateway_config(upstream, redis), env=env) as first,
        gateway(gateway_config(upstream, redis), env=env) as second,
    ):
        yield first, second


def _spent(client: httpx.Client, server: RunningServer) -> float:
    usage = client.get(server.url + "/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    [entry] = usage.json()["keys"]
    return float(entry["budget"]["spent"])


def test_a_key_with_a_budget_is_refused_once_spent_across_two_gateways(
    gateways: tuple[RunningServer, RunningServer],
) -> None:
    first, second = gateways
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    auth = {"authorization": f"Bearer {KEY}"}
    statuses: list[int] = []
    with httpx.Client(timeout=30) as client:
        for turn in range(6):
            server = (first, second)[turn % 2]
            response = client.post(server.url + "/v1/chat/completions", json=body, headers=auth)
            statuses.append(response.status_code)
            if response.status_code != 200:
                break
            assert response.headers["x-llmso-cost"] == "0.002"
            # The charge lands once the answer is sent: wait for it in the shared store.
            deadline = time.monotonic() + 10
            while _spent(client, first) < ONE_ANSWER * (turn + 1) - 1e-9:
                assert time.monotonic() < deadline, "the answer was never charged"
                time.sleep(0.05)
        assert statuses == [200, 200, 200, 200, 429]
        period_end = bounds(time.time(), "month")[1] * DAY
        for server in (first, second):  # both gateways refuse now, each from the store
            refused = client.post(server.url + "/v1/chat/completions", json=body, headers=auth)
            assert refused.status_code == 429
            assert refused.json()["error"]["code"] == "budget_exceeded"
            assert abs(int(refused.headers["retry-after"]) - (period_end - time.time())) <= 5
            assert _spent(client, server) == pytest.approx(4 * ONE_ANSWER)
        metrics = client.get(first.url + "/metrics").text + client.get(second.url + "/metrics").text
        charged = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("llmso_spend_total{") and 'key="spender"' in line
        )
        assert charged == pytest.approx(4 * ONE_ANSWER)  # two each, per replica
