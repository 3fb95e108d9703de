"""Service tier for the front door, part two: limits (rpm, tpm with settlement,
max_parallel, daily budget, x-ratelimit-*), store failure policies, per-key metrics,
/admin/usage, priorities and hot reload of keys, on the in-process store (the Redis store
has its own e2e module).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import orjson
import pytest
import yaml

from config.loader import load_config
from tests.tools.frontdoor_app import (
    ADMIN,
    JSON_HEADERS,
    KEY_A,
    KEY_B,
    AppFactory,
    bearer,
    chat,
    drive,
    keys,
    make_config,
    metric,
    team,
)
from tests.tools.servers import free_port

# --------------------------------------------------------------------------- limits


async def test_rpm_limit_429_retry_after_and_headers(make_app: AppFactory) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, rpm=3, tpm=10_000))))
    responses = [
        await app.http.post("/v1/chat/completions", json=chat(max_tokens=2), headers=bearer(KEY_A))
        for _ in range(4)
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    first, refused = responses[0], responses[3]
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    assert re.fullmatch(r"\d+(ms|(\.\d+)?s)", first.headers["x-ratelimit-reset-requests"])
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) < 10_000
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.json()["error"]["type"] == "requests"
    assert 1 <= int(refused.headers["retry-after"]) <= 20
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # Headers on every response of a limited key, errors before admission included.
    bad = await app.http.post("/v1/chat/completions", json={"model": 3}, headers=bearer(KEY_A))
    assert bad.status_code == 400 and bad.headers["x-ratelimit-limit-requests"] == "3"
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_key_requests_total", key="team-a", status="client_error") == 2
    assert metric(text, "llmso_key_tokens_total", key="team-a", type="completion") == 6


async def test_tpm_reserves_then_settles_with_real_usage(make_app: AppFactory) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, tpm=1000))))
    auth = bearer(KEY_A)
    # Reserves ~prompt + 900, uses 7 + 3: the rest comes back at the end.
    one = await app.http.post(
        "/v1/chat/completions", json=chat(max_tokens=900, stop=None), headers=auth
    )
    assert one.status_code == 200
    assert int(one.headers["x-ratelimit-remaining-tokens"]) < 100
    app.backends["alpha"].calls.clear()
    two = await app.http.post("/v1/chat/completions", json=chat(max_tokens=900), headers=auth)
    assert two.status_code == 200, two.text  # fits only because the first one was settled
    three = await app.http.post("/v1/chat/completions", json=chat(max_tokens=2000), headers=auth)
    assert three.status_code == 429
    assert "Request too large" in three.json()["error"]["message"]
    assert three.json()["error"]["type"] == "tokens"


async def test_stream_cut_short_is_settled_with_what_it_used(make_app: AppFactory) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, tpm=1000, max_parallel=1))))
    headers = [*JSON_HEADERS, (b"authorization", f"Bearer {KEY_A}".encode())]
    body = orjson.dumps(chat(content="hold", max_tokens=900, stream=True))
    request = {"type": "http.request", "body": body, "more_body": False}
    # The client leaves after the first token; the backend holds the second.
    status, _, _ = await drive(
        app.asgi, "/v1/chat/completions", headers, [request, 0.3, {"type": "http.disconnect"}]
    )
    assert status == 200
    admission = app.asgi.state.admission
    client = admission.keys.clients()[0]
    verdict = await admission.store.peek(client.name, client.limits)
    assert verdict.inflight == 0  # the max_parallel slot was released
    assert verdict.tokens is not None and verdict.tokens.remaining > 900  # ~ prompt + 1 token used
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_key_requests_total", key="team-a", status="disconnected") == 1
    assert metric(text, "llmso_key_tokens_total", key="team-a", type="completion") == 1


async def test_max_parallel(make_app: AppFactory) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, max_parallel=1))))
    auth = bearer(KEY_A)
    held = asyncio.create_task(
        app.http.post("/v1/chat/completions", json=chat(content="hold", max_tokens=3), headers=auth)
    )
    for _ in range(500):
        if "alpha" in app.backends and app.backends["alpha"].calls:
            break
        await asyncio.sleep(0.01)
    second = await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=auth)
    assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limit_exceeded"
    app.backends["alpha"].release.set()
    assert (await held).status_code == 200
    third = await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=auth)
    assert third.status_code == 200


async def test_daily_budget_is_insufficient_quota(make_app: AppFactory) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, tokens_per_day=30))))
    auth = bearer(KEY_A)
    codes = []
    for _ in range(4):
        response = await app.http.post(
            "/v1/chat/completions", json=chat(max_tokens=5), headers=auth
        )
        codes.append(response.status_code)
    assert codes == [200, 200, 200, 429]  # 7 + 3 tokens each, settled: 30 used after three
    assert response.json()["error"]["code"] == "insufficient_quota"
    assert int(response.headers["retry-after"]) <= 86400
    usage = (await app.http.get("/admin/usage", headers=bearer(ADMIN))).json()
    (entry,) = usage["keys"]
    assert entry["name"] == "team-a"
    assert entry["today"]["tokens_used"] == 30
    assert entry["today"]["budget_left"] == 0
    assert entry["requests"] == {"ok": 3, "client_error": 1}
    assert entry["tokens"] == {"prompt": 21, "completion": 9}
    assert KEY_A not in orjson.dumps(usage).decode()
    assert (await app.http.get("/admin/usage", headers=bearer(KEY_A))).status_code == 401


@pytest.mark.parametrize(("policy", "expected"), [("allow", 200), ("deny", 503)])
async def test_store_down_policy(make_app: AppFactory, policy: str, expected: int) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    config = make_config(
        **keys(team("team-a", KEY_A, rpm=1)),
        limits={"store": dead, "on_store_error": policy, "store_timeout": 0.5},
    )
    app = await make_app(config)
    for _ in range(3):
        response = await app.http.post(
            "/v1/chat/completions", json=chat(max_tokens=1), headers=bearer(KEY_A)
        )
        assert response.status_code == expected
    if policy == "deny":
        assert response.json()["error"]["code"] == "limit_store_unavailable"
        assert "retry-after" in response.headers
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_limit_store_up") == 0
    assert metric(text, "llmso_limit_store_errors_total") >= 1


async def test_priority_reaches_the_backend(make_app: AppFactory) -> None:
    app = await make_app(
        make_config(**keys(team("hi", KEY_A, priority="high"), team("lo", KEY_B, priority="low")))
    )
    for key in (KEY_A, KEY_B):
        await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=bearer(key))
    assert [call.priority for call in app.backends["alpha"].calls] == [-1, 1]


async def test_keys_hot_reload(make_app: AppFactory, tmp_path: Path) -> None:
    path = tmp_path / "llmso.yaml"
    raw = make_config(**keys(team("team-a", KEY_A))).model_dump(
        mode="json", exclude={"source_path"}
    )
    path.write_text(yaml.safe_dump(raw))
    app = await make_app(load_config(path), watch_config=True)
    auth_a, auth_b = bearer(KEY_A), bearer(KEY_B)
    path_ = "/v1/chat/completions"
    assert (await app.http.post(path_, json=chat(max_tokens=1), headers=auth_a)).is_success
    assert (await app.http.post(path_, json=chat(max_tokens=1), headers=auth_b)).status_code == 401
    raw["auth"]["keys"] = [team("team-b", KEY_B, rpm=1)]
    path.write_text(yaml.safe_dump(raw))
    for _ in range(100):
        if (await app.http.post(path_, json=chat(max_tokens=1), headers=auth_b)).is_success:
            break
        await asyncio.sleep(0.1)
    assert (await app.http.post(path_, json=chat(max_tokens=1), headers=auth_a)).status_code == 401
    again = await app.http.post(path_, json=chat(max_tokens=1), headers=auth_b)
    assert again.status_code == 429  # the new key's new limit applies at once
