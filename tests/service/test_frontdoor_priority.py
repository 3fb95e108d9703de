"""Service tier for the front door, part three: a request's own ``priority`` within its
key's range (400 outside), the key as the request's tenant (fair-share weight), and a
relayed model's slots shared fairly between keys, through the real openai backend
against a fake upstream (which also shows what priority the relay sends upstream)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from backends.base import Tenant
from bench.fake_upstream import FakeOptions, FakeUpstream
from config.schema import AppConfig
from gateway.app import build_app
from tests.tools.frontdoor_app import (
    ADMIN,
    KEY_A,
    KEY_B,
    AppFactory,
    bearer,
    chat,
    keys,
    make_config,
    team,
)


async def test_a_request_priority_within_the_key_range(make_app: AppFactory) -> None:
    app = await make_app(
        make_config(
            **keys(
                team("ranged", KEY_A, priority="normal", priority_range=["high", 3], weight=2),
                team("fixed", KEY_B, priority="low"),
            )
        )
    )
    asked = [(KEY_A, None), (KEY_A, -1), (KEY_A, 3), (KEY_B, None), (KEY_B, 1)]
    for key, priority in asked:
        body = chat(max_tokens=1) | ({} if priority is None else {"priority": priority})
        response = await app.http.post("/v1/chat/completions", json=body, headers=bearer(key))
        assert response.status_code == 200, response.text
    calls = app.backends["alpha"].calls
    assert [call.priority for call in calls] == [0, -1, 3, 1, 1]
    assert [call.tenant for call in calls[:2]] == [Tenant("ranged", 2.0)] * 2
    assert calls[3].tenant == Tenant("fixed", 1.0)
    assert all("priority" not in call.passthrough for call in calls)


@pytest.mark.parametrize(
    ("key", "priority", "allowed"),
    [(KEY_A, -2, "from -1 to 3"), (KEY_A, 4, "from -1 to 3"), (KEY_B, 0, "only 1")],
)
async def test_a_priority_outside_the_range_is_a_400(
    make_app: AppFactory, key: str, priority: int, allowed: str
) -> None:
    app = await make_app(
        make_config(
            **keys(
                team("ranged", KEY_A, priority_range=[-1, 3]),
                team("fixed", KEY_B, priority="low"),
            )
        )
    )
    body = chat(max_tokens=1, priority=priority)
    response = await app.http.post("/v1/chat/completions", json=body, headers=bearer(key))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "priority" and allowed in error["message"]
    assert "alpha" not in app.backends or not app.backends["alpha"].calls


async def test_without_keys_any_priority_within_the_limit(make_app: AppFactory) -> None:
    app = await make_app(make_config())
    for priority in (-10, 10, 11):
        await app.http.post("/v1/chat/completions", json=chat(max_tokens=1, priority=priority))
    assert [call.priority for call in app.backends["alpha"].calls] == [-10, 10]
    bad = await app.http.post(
        "/v1/completions", json={"model": "alpha", "prompt": "x", "priority": "urgent"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"


# --------------------------------------------------------------------------- relayed


@contextlib.asynccontextmanager
async def relay_app(upstream: FakeUpstream, **model: Any) -> AsyncIterator[httpx.AsyncClient]:
    config = AppConfig.model_validate(
        {
            "models": [
                {
                    "name": "relay",
                    "backend": "openai",
                    "base_url": f"{upstream.url}/v1",
                    "upstream_model": "fake-model",
                    **model,
                }
            ],
            **keys(team("a", KEY_A, priority_range=[-1, 1]), team("b", KEY_B)),
        }
    )
    app = build_app(config, admin_key=ADMIN)
    lifespan = app.lifespan()
    await lifespan.__aenter__()
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client
    finally:
        await lifespan.__aexit__(None, None, None)


async def test_a_relayed_models_slots_are_shared_between_keys() -> None:
    """Key a sends six requests at once to a relayed model with one slot, then key b one:
    b's reaches the upstream second (the first slot that frees), not seventh; a's own go
    in the order sent. The registry lets them all through to the relay's line."""
    upstream = FakeUpstream(FakeOptions(chunks=3, delay_ms=20))
    async with upstream, relay_app(upstream, max_concurrency=1) as client:

        async def send(key: str, text: str) -> int:
            body = chat("relay", text, max_tokens=3)
            response = await client.post("/v1/chat/completions", json=body, headers=bearer(key))
            return response.status_code

        burst = []
        for index in range(6):
            burst.append(asyncio.create_task(send(KEY_A, f"a{index}")))
            await asyncio.sleep(0.005)
        late = asyncio.create_task(send(KEY_B, "b"))
        assert await asyncio.gather(*burst, late) == [200] * 7
    order = [body["messages"][-1]["content"] for body in upstream.bodies]
    assert order.index("b") == 1
    assert [text for text in order if text != "b"] == [f"a{index}" for index in range(6)]


async def test_the_relay_sends_the_resolved_priority_only_when_configured() -> None:
    async with FakeUpstream(FakeOptions(chunks=1)) as upstream:
        for send_priority in (False, True):
            async with relay_app(upstream, send_priority=send_priority) as client:
                for priority in (-1, 0):
                    body = chat("relay", max_tokens=1, priority=priority)
                    response = await client.post(
                        "/v1/chat/completions", json=body, headers=bearer(KEY_A)
                    )
                    assert response.status_code == 200
    sent = [body.get("priority") for body in upstream.bodies]
    assert sent == [None, None, -1, None]  # never the client's raw field; 0 is the default
