"""Service tier for the front door, part one: accounting of refused requests, web safety
(415, CORS, Host, 408) and client keys (401, 404 allow-lists, /v1/models). The app runs
in-process over ASGI with an echo backend (``tests.tools.frontdoor_app``).
"""

from __future__ import annotations

import logging

import orjson
import pytest

from config.frontdoor import hash_key
from config.schema import AppConfig
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

# --------------------------------------------------------------------------- accounting


async def test_every_refused_request_is_counted_and_logged(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make_app(make_config(server={"max_body_bytes": 2000}))
    caplog.set_level(logging.INFO, logger="llmso.requests")
    http = app.http
    path = "/v1/chat/completions"
    statuses = [
        (await http.post(path, content=orjson.dumps(chat()))).status_code,  # no content-type
        (await http.post(path, content=b"x", headers={"content-type": "text/plain"})).status_code,
        (await http.get(path)).status_code,
        (
            await http.post(path, content=b"{no", headers={"content-type": "application/json"})
        ).status_code,
        (await http.post(path, json=chat(model="nope"))).status_code,
        (await http.post(path, json=chat(content="x" * 3000))).status_code,
        (await http.post(path, json=chat(max_tokens=2))).status_code,
    ]
    assert statuses == [415, 415, 405, 400, 404, 413, 200]
    text = (await http.get("/metrics")).text
    assert metric(text, "llmso_requests_total", model="unrouted", status="client_error") == 6
    assert metric(text, "llmso_requests_total", model="alpha", status="ok") == 1
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "llmso.requests"]
    assert len(lines) == 7
    assert [line["status"] for line in lines].count("client_error") == 6
    assert {line["model"] for line in lines} >= {"unrouted", "nope", "alpha"}


async def test_415_names_the_content_type(make_app: AppFactory) -> None:
    app = await make_app(make_config())
    response = await app.http.post(
        "/v1/completions", content=b'{"prompt": "x"}', headers={"content-type": "text/plain"}
    )
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    ok = await app.http.post(
        "/v1/completions",
        content=orjson.dumps({"model": "alpha", "prompt": "x", "max_tokens": 1}),
        headers={"content-type": "Application/JSON; charset=utf-8"},
    )
    assert ok.status_code == 200


# --------------------------------------------------------------------------- web safety


async def test_cors_is_off_by_default(make_app: AppFactory) -> None:
    app = await make_app(make_config())
    origin = {"origin": "https://evil.example"}
    response = await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=origin)
    assert "access-control-allow-origin" not in response.headers
    preflight = await app.http.options(
        "/v1/chat/completions", headers={**origin, "access-control-request-method": "POST"}
    )
    assert preflight.status_code == 405
    assert "access-control-allow-origin" not in preflight.headers


async def test_cors_allow_list(make_app: AppFactory) -> None:
    app = await make_app(make_config(server={"cors_origins": ["https://app.example"]}))
    good = {"origin": "https://app.example"}
    preflight = await app.http.options(
        "/v1/chat/completions",
        headers={
            **good,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    response = await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=good)
    assert response.headers["access-control-allow-origin"] == "https://app.example"
    assert "x-ratelimit-remaining-requests" in response.headers["access-control-expose-headers"]
    models = await app.http.get("/v1/models", headers=good)
    assert models.headers["access-control-allow-origin"] == "https://app.example"
    other = await app.http.post(
        "/v1/chat/completions", json=chat(max_tokens=1), headers={"origin": "https://x.example"}
    )
    assert "access-control-allow-origin" not in other.headers


async def test_dns_rebinding_defence_when_bound_to_loopback(make_app: AppFactory) -> None:
    app = await make_app(make_config(), bind_host="127.0.0.1")
    for host, expected in [
        ("localhost:8000", 200),
        ("127.0.0.1:8000", 200),
        ("[::1]:8000", 200),
        ("attacker.example:8000", 403),
        ("localhost.attacker.example", 403),
    ]:
        response = await app.http.post(
            "/v1/chat/completions", json=chat(max_tokens=1), headers={"host": host}
        )
        assert response.status_code == expected, host
        models = await app.http.get("/v1/models", headers={"host": host})
        assert models.status_code == expected, host
    assert response.json()["error"]["code"] == "host_not_allowed"
    open_app = await make_app(make_config(), bind_host="0.0.0.0")
    response = await open_app.http.get("/v1/models", headers={"host": "gw.internal"})
    assert response.status_code == 200
    listed = await make_app(
        make_config(server={"allowed_hosts": [".corp.example"]}), bind_host="0.0.0.0"
    )
    assert (await listed.http.get("/health", headers={"host": "gw.corp.example"})).is_success
    assert (await listed.http.get("/health", headers={"host": "gw.other"})).status_code == 403


async def test_trickling_body_gets_408(make_app: AppFactory) -> None:
    app = await make_app(make_config(server={"body_timeout": 0.3}))
    part = {"type": "http.request", "body": b'{"model": ', "more_body": True}
    status, headers, body = await drive(
        app.asgi, "/v1/chat/completions", JSON_HEADERS, [part, 0.2, part, 0.2, part]
    )
    assert status == 408
    assert headers[b"connection"] == b"close"
    assert orjson.loads(body)["error"]["code"] == "request_timeout"


# --------------------------------------------------------------------------- keys


async def test_keys_bearer_api_key_and_401(make_app: AppFactory) -> None:
    config = make_config(
        **keys(team("team-a", KEY_A), {"name": "team-b", "key_sha256": hash_key(KEY_B)})
    )
    app = await make_app(config)
    path = "/v1/chat/completions"
    missing = await app.http.post(path, json=chat(max_tokens=1))
    wrong = await app.http.post(path, json=chat(max_tokens=1), headers=bearer(KEY_A + "x"))
    for response in (missing, wrong):
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert KEY_A not in response.text
    assert (await app.http.post(path, json=chat(max_tokens=1), headers=bearer(KEY_A))).is_success
    azure = await app.http.post(path, json=chat(max_tokens=1), headers={"api-key": KEY_B})
    assert azure.is_success
    assert (await app.http.get("/v1/models")).status_code == 401
    # The admin key is separate: it is not a client key, and a client key is not admin.
    assert (
        await app.http.post(path, json=chat(max_tokens=1), headers=bearer(ADMIN))
    ).status_code == 401
    assert (await app.http.get("/admin/models", headers=bearer(KEY_A))).status_code == 401
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_key_requests_total", key="unauthenticated") == 3
    assert metric(text, "llmso_key_requests_total", key="team-b", status="ok") == 1


async def test_model_allow_list_hides_models(make_app: AppFactory) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, models=["capability:small"]))))
    auth = bearer(KEY_A)
    path = "/v1/chat/completions"
    assert (await app.http.post(path, json=chat("alpha", max_tokens=1), headers=auth)).is_success
    capability = await app.http.post(
        path, json=chat("capability:small", max_tokens=1), headers=auth
    )
    assert capability.is_success
    forbidden = await app.http.post(path, json=chat("beta", max_tokens=1), headers=auth)
    missing = await app.http.post(path, json=chat("gamma", max_tokens=1), headers=auth)
    assert forbidden.status_code == missing.status_code == 404
    assert forbidden.json() == {
        "error": {**missing.json()["error"], "message": "The model 'beta' does not exist"}
    }
    by_alias = await app.http.post(path, json=chat("b", max_tokens=1), headers=auth)
    assert by_alias.json()["error"]["message"] == "The model 'b' does not exist"
    listed = (await app.http.get("/v1/models", headers=auth)).json()
    assert [card["id"] for card in listed["data"]] == ["alpha"]
    assert (await app.http.get("/v1/models/beta", headers=auth)).status_code == 404
    assert (await app.http.get("/v1/models/alpha", headers=auth)).is_success


async def test_fallback_skips_models_the_key_may_not_use(make_app: AppFactory) -> None:
    config = AppConfig.model_validate(
        {
            "models": [
                {
                    "name": "alpha",
                    "backend": "openai",
                    "base_url": "http://u",
                    "fallback": ["beta"],
                },
                {"name": "beta", "backend": "openai", "base_url": "http://u"},
            ],
            **keys(team("team-a", KEY_A, models=["alpha"])),
        }
    )
    app = await make_app(config)
    await app.asgi.state.registry.unload("alpha")
    await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=bearer(KEY_A))
    assert app.backends["beta"].calls == []
