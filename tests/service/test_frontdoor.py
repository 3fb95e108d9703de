"""Service tier for the front door: the whole app in-process over ASGI, a scripted echo
backend, and the in-process limit store (the Redis store has its own e2e module).

Each status and header the issue names: accounting of refused requests, web safety
(415, CORS, Host, 408), keys (401, 404 allow-lists, /v1/models), limits (rpm, tpm with
settlement, max_parallel, daily budget, x-ratelimit-*), store failure policies, per-key
metrics, /admin/usage, priorities, and hot reload of keys.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from backends.base import (
    Backend,
    BackendEvent,
    Finished,
    GenerationRequest,
    ModelInfo,
    Started,
    TextDelta,
    Usage,
)
from config.frontdoor import hash_key
from config.loader import load_config
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app
from tests.tools.servers import free_port

ADMIN = "admin-secret-1"
KEY_A = "sk-team-a-0123456789"
KEY_B = "sk-team-b-0123456789"
PROMPT_TOKENS = 7


class EchoBackend:
    """Up to three ``tok`` (fewer if max_tokens says so); a prompt of ``hold`` waits for
    ``release`` before its second token."""

    def __init__(self, config: ModelConfig) -> None:
        self.calls: list[GenerationRequest] = []
        self.release = asyncio.Event()

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ready(self) -> bool:
        return True

    def info(self) -> ModelInfo:
        return ModelInfo(max_context=4096)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.calls.append(request)
        yield Started(queued_at=1.0, started_at=1.0)
        hold = bool(request.messages) and request.messages[-1].content == "hold"
        count = min(3, request.sampling.max_tokens)
        for index in range(count):
            if hold and index == 1:
                await self.release.wait()
            yield TextDelta(index=0, text=" tok")
        yield Finished(index=0, reason="length")
        yield Usage(prompt_tokens=PROMPT_TOKENS, completion_tokens=count)


def make_config(**sections: Any) -> AppConfig:
    models = [
        {"name": "alpha", "backend": "openai", "base_url": "http://u", "capabilities": ["small"]},
        {"name": "beta", "backend": "openai", "base_url": "http://u", "aliases": ["b"]},
    ]
    return AppConfig.model_validate({"models": models, **sections})


def keys(*entries: dict[str, Any], **limits: Any) -> dict[str, Any]:
    return {"auth": {"required": True, "keys": list(entries)}, **limits}


class App:
    def __init__(self, app: Any, backends: dict[str, EchoBackend]) -> None:
        self.asgi = app
        self.backends = backends
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


@pytest.fixture
async def make_app() -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[Any, App]] = []

    async def make(config: AppConfig, **kwargs: Any) -> App:
        backends: dict[str, EchoBackend] = {}

        def factory(model: ModelConfig, _on_crash: Any) -> Backend:
            backends[model.name] = EchoBackend(model)
            return backends[model.name]

        app = build_app(config, admin_key=ADMIN, backend_factory=factory, **kwargs)
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        made = App(app, backends)
        opened.append((lifespan, made))
        return made

    yield make
    for lifespan, made in opened:
        await made.http.aclose()
        await lifespan.__aexit__(None, None, None)


def chat(model: str = "alpha", content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


# --------------------------------------------------------------------------- accounting


async def test_every_refused_request_is_counted_and_logged(
    make_app: Callable[..., Any], caplog: pytest.LogCaptureFixture
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


async def test_415_names_the_content_type(make_app: Callable[..., Any]) -> None:
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


async def test_cors_is_off_by_default(make_app: Callable[..., Any]) -> None:
    app = await make_app(make_config())
    origin = {"origin": "https://evil.example"}
    response = await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=origin)
    assert "access-control-allow-origin" not in response.headers
    preflight = await app.http.options(
        "/v1/chat/completions", headers={**origin, "access-control-request-method": "POST"}
    )
    assert preflight.status_code == 405
    assert "access-control-allow-origin" not in preflight.headers


async def test_cors_allow_list(make_app: Callable[..., Any]) -> None:
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


async def test_dns_rebinding_defence_when_bound_to_loopback(make_app: Callable[..., Any]) -> None:
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


async def drive(
    app: Any, path: str, headers: list[tuple[bytes, bytes]], messages: list[Any]
) -> tuple[int, dict[bytes, bytes], bytes]:
    """Run one request through the ASGI app; ``messages`` are what ``receive`` returns,
    in order (a float: sleep that long first), then it waits forever."""
    sent: list[dict[str, Any]] = []
    queue = list(messages)

    async def receive() -> dict[str, Any]:
        while queue:
            item = queue.pop(0)
            if isinstance(item, float):
                await asyncio.sleep(item)
                continue
            return dict(item)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers,
        "query_string": b"",
        "server": ("127.0.0.1", 8000),
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


JSON_HEADERS = [(b"content-type", b"application/json"), (b"host", b"t")]


async def test_trickling_body_gets_408(make_app: Callable[..., Any]) -> None:
    app = await make_app(make_config(server={"body_timeout": 0.3}))
    part = {"type": "http.request", "body": b'{"model": ', "more_body": True}
    status, headers, body = await drive(
        app.asgi, "/v1/chat/completions", JSON_HEADERS, [part, 0.2, part, 0.2, part]
    )
    assert status == 408
    assert headers[b"connection"] == b"close"
    assert orjson.loads(body)["error"]["code"] == "request_timeout"


# --------------------------------------------------------------------------- keys


def team(name: str, key: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "key": key, **fields}


async def test_keys_bearer_api_key_and_401(make_app: Callable[..., Any]) -> None:
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


async def test_model_allow_list_hides_models(make_app: Callable[..., Any]) -> None:
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


async def test_fallback_skips_models_the_key_may_not_use(make_app: Callable[..., Any]) -> None:
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


# --------------------------------------------------------------------------- limits


async def test_rpm_limit_429_retry_after_and_headers(make_app: Callable[..., Any]) -> None:
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


async def test_tpm_reserves_then_settles_with_real_usage(make_app: Callable[..., Any]) -> None:
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


async def test_stream_cut_short_is_settled_with_what_it_used(make_app: Callable[..., Any]) -> None:
    app = await make_app(make_config(**keys(team("team-a", KEY_A, tpm=1000, max_parallel=1))))
    headers = [*JSON_HEADERS, (b"authorization", f"Bearer {KEY_A}".encode())]
    body = orjson.dumps(chat(content="hold", max_tokens=900, stream=True))
    request = {"type": "http.request", "body": body, "more_body": False}
    # The client leaves after the first token; the backend holds the second.
    status, _, _ = await drive(
        app.asgi, "/v1/chat/completions", headers, [request, 0.3, {"type": "http.disconnect"}]
    )
    assert status == 200
    door = app.asgi.state.frontdoor
    client = door.keys.clients()[0]
    verdict = await door.store.peek(client.name, client.limits)
    assert verdict.inflight == 0  # the max_parallel slot was released
    assert verdict.tokens is not None and verdict.tokens.remaining > 900  # ~ prompt + 1 token used
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_key_requests_total", key="team-a", status="disconnected") == 1
    assert metric(text, "llmso_key_tokens_total", key="team-a", type="completion") == 1


async def test_max_parallel(make_app: Callable[..., Any]) -> None:
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


async def test_daily_budget_is_insufficient_quota(make_app: Callable[..., Any]) -> None:
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
async def test_store_down_policy(make_app: Callable[..., Any], policy: str, expected: int) -> None:
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


async def test_priority_reaches_the_backend(make_app: Callable[..., Any]) -> None:
    app = await make_app(
        make_config(**keys(team("hi", KEY_A, priority="high"), team("lo", KEY_B, priority="low")))
    )
    for key in (KEY_A, KEY_B):
        await app.http.post("/v1/chat/completions", json=chat(max_tokens=1), headers=bearer(key))
    assert [call.priority for call in app.backends["alpha"].calls] == [-1, 1]


async def test_keys_hot_reload(make_app: Callable[..., Any], tmp_path: Path) -> None:
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
