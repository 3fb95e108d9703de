"""Traffic splits and mirrors through the whole app over ASGI, on the repo's fake backend:
a 90/10 split over 400 requests, sticky sessions, the `model` field and the request log,
key allow-lists, mirrored copies that reach the shadow but never the client nor the key's
usage, a failing shadow, the per-model bound and shutdown, and hot reload of both."""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from prometheus_client import CollectorRegistry

from backends.base import BackendEvent, GenerationRequest, TextDelta, UpstreamUnavailable
from config.loader import load_config
from config.schema import AppConfig
from gateway.app import build_app
from gateway.observe.logs import REQUEST_LOGGER
from gateway.registry.split import mirrored
from tests.tools.fake_backend import FakeBackend
from tests.tools.registry_fakes import fake_model, wait_until

ADMIN = "split-admin"
KEY = "sk-split-team-0123456789"


class Counted(FakeBackend):
    """The fake backend, keeping every request it is sent. ``marker`` prefixes each token
    of this model's first choice; ``down`` makes every request fail as an unreachable
    upstream."""

    def __init__(
        self, config: Any, on_crash: Any, *, marker: str = "", down: bool = False, **knobs: Any
    ) -> None:
        super().__init__(config, None, on_crash, **knobs)
        self.requests: list[GenerationRequest] = []
        self.marker = marker
        self.down = down

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        self.requests.append(request)
        if self.down:
            raise UpstreamUnavailable("shadow upstream is down")
        async for event in super().generate(request):
            marked = self.marker and isinstance(event, TextDelta) and not event.index
            yield TextDelta(index=0, text=self.marker + event.text) if marked else event


@dataclass
class Gateway:
    http: httpx.AsyncClient
    backends: dict[str, Counted]
    prometheus: CollectorRegistry
    close: Callable[[], Awaitable[None]]

    def sample(self, name: str, **labels: str) -> float:
        return self.prometheus.get_sample_value(name, labels) or 0.0

    def served(self, model: str) -> int:
        backend = self.backends.get(model)
        return 0 if backend is None else len(backend.requests)

    def mirrors(self, outcome: str, model: str = "a", shadow: str = "shadow") -> float:
        labels = {"model": model, "shadow": shadow, "outcome": outcome}
        return self.sample("llmso_mirror_requests_total", **labels)


Start = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    running: list[Gateway] = []

    async def make(config: AppConfig, *, watch: bool = False, **knobs: dict[str, Any]) -> Gateway:
        backends: dict[str, Counted] = {}

        def factory(model: Any, on_crash: Any) -> Counted:
            backends[model.name] = Counted(model, on_crash, **knobs.get(model.name, {}))
            return backends[model.name]

        app = build_app(config, admin_key=ADMIN, backend_factory=factory, watch_config=watch)
        lifespan = app.lifespan()
        await lifespan.__aenter__()
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
        closed = False

        async def close() -> None:
            nonlocal closed
            if not closed:
                closed = True
                await http.aclose()
                await lifespan.__aexit__(None, None, None)

        gateway = Gateway(http, backends, app.state.prometheus, close)
        running.append(gateway)
        return gateway

    yield make
    for gateway in running:
        await gateway.close()


def models(*names: str, **extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [fake_model(name, **extra.get(name, {})) for name in names]


def config(*names: str, routes: list[dict[str, Any]] | None = None, **sections: Any) -> AppConfig:
    mirror = sections.pop("mirror", None)
    extra = {"a": {"mirror": mirror}} if mirror else {}
    raw = {"models": models(*names, **extra), "routes": routes or [], **sections}
    return AppConfig.model_validate(raw)


def split(**weights: int) -> list[dict[str, Any]]:
    return [{"name": "chat", "split": weights}]


def body(model: str = "chat", content: str = "one two three", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


async def chat(
    gateway: Gateway, request_id: str, *, headers: dict[str, str] | None = None, **fields: Any
) -> httpx.Response:
    response = await gateway.http.post(
        "/v1/chat/completions",
        json=body(**fields),
        headers={"x-request-id": request_id, **(headers or {})},
    )
    assert response.status_code == 200, response.text
    return response


def normalised(content: bytes) -> bytes:
    """A response body without what differs between any two requests (id, created)."""
    content = re.sub(rb'"id":"[^"]*"', b'"id":"-"', content)
    return re.sub(rb'"created":\d+', b'"created":0', content)


# --------------------------------------------------------------------------- splits


async def test_a_90_10_split_sends_90_percent_of_400_requests_to_its_first_target(
    start: Start,
) -> None:
    gateway = await start(config("a", "b", routes=split(a=90, b=10)))
    answered: Counter[str] = Counter()
    for batch in range(8):
        responses = await asyncio.gather(
            *(chat(gateway, f"req-{batch * 50 + i}") for i in range(50))
        )
        answered.update(r.json()["model"] for r in responses)
    assert 360 - 20 <= answered["a"] <= 360 + 20
    assert answered["a"] + answered["b"] == 400
    # The backends, the route counter and the per-model series agree with the bodies.
    for target in ("a", "b"):
        assert gateway.served(target) == answered[target]
        routed = gateway.sample("llmso_route_requests_total", route="chat", target=target)
        assert routed == answered[target]
        finished = gateway.sample(
            "llmso_requests_total",
            model=target,
            backend="openai",
            status="ok",
            endpoint="/v1/chat/completions",
        )
        assert finished == answered[target]


async def test_the_target_is_what_the_response_and_the_log_name(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start(config("a", "b", routes=split(a=1, b=1)))
    with caplog.at_level(logging.INFO, REQUEST_LOGGER):
        responses = [await chat(gateway, f"log-{i}") for i in range(20)]
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == REQUEST_LOGGER]
    by_id = {line["request_id"]: line for line in lines}
    for response in responses:
        line = by_id[response.headers["x-request-id"]]
        assert response.json()["model"] == line["model"] in {"a", "b"}
        assert line["route"] == "chat" and line["mirror_of"] is None
    assert {r.json()["model"] for r in responses} == {"a", "b"}
    # A request for a model by name is no route's.
    direct = await chat(gateway, "direct", model="b")
    assert direct.json()["model"] == "b"


async def test_a_multi_prompt_completion_is_one_routed_request(start: Start) -> None:
    gateway = await start(config("a", "b", routes=split(a=1, b=1)))
    for i in range(10):
        prompts = ["one two", "three four", "five six"]
        response = await gateway.http.post(
            "/v1/completions",
            json={"model": "chat", "prompt": prompts, "max_tokens": 4},
            headers={"x-request-id": f"multi-{i}"},
        )
        assert response.status_code == 200, response.text
        assert len(response.json()["choices"]) == 3
    routed = [gateway.sample("llmso_route_requests_total", route="chat", target=t) for t in "ab"]
    assert sum(routed) == 10  # one per request, not per prompt
    assert [gateway.served(t) for t in "ab"] == [3 * n for n in routed]  # prompts stay together


async def test_sticky_sessions_stay_on_one_target(start: Start) -> None:
    gateway = await start(config("a", "b", routes=split(a=1, b=1)))
    by_header: dict[str, set[str]] = {}
    by_user: dict[str, set[str]] = {}
    for session in range(12):
        for turn in range(5):
            rid = f"s{session}-{turn}"
            # The header wins over `user`, which changes every turn here.
            header = {"x-session-id": f"session-{session}"}
            one = await chat(gateway, rid, headers=header, user=f"u{turn}")
            two = await chat(gateway, rid + "u", user=f"user-{session}")
            by_header.setdefault(str(session), set()).add(one.json()["model"])
            by_user.setdefault(str(session), set()).add(two.json()["model"])
    for seen in (by_header, by_user):
        assert all(len(targets) == 1 for targets in seen.values())
        assert set().union(*seen.values()) == {"a", "b"}  # sessions do spread


async def test_non_sticky_routes_draw_every_request(start: Start) -> None:
    routes = [{"name": "chat", "split": {"a": 1, "b": 1}, "sticky": False}]
    gateway = await start(config("a", "b", routes=routes))
    header = {"x-session-id": "one-session"}
    seen = {(await chat(gateway, f"r{i}", headers=header)).json()["model"] for i in range(30)}
    assert seen == {"a", "b"}


async def test_key_allow_lists_and_the_model_list(start: Start) -> None:
    keys = [
        {"name": "by-route", "key": KEY, "models": ["chat"]},
        {"name": "only-b", "key": KEY + "-b", "models": ["b"]},
        {"name": "only-c", "key": KEY + "-c", "models": ["c"]},
    ]
    parsed = config("a", "b", "c", routes=split(a=1, b=1), auth={"required": True, "keys": keys})
    gateway = await start(parsed)

    def auth(key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    seen = {(await chat(gateway, f"k{i}", headers=auth(KEY))).json()["model"] for i in range(20)}
    assert seen == {"a", "b"}  # naming the route grants its targets
    only_b = {
        (await chat(gateway, f"b{i}", headers=auth(KEY + "-b"))).json()["model"] for i in range(20)
    }
    assert only_b == {"b"}  # the split picks among the targets the key may use
    refused = await gateway.http.post("/v1/chat/completions", json=body(), headers=auth(KEY + "-c"))
    assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"
    cards = (await gateway.http.get("/v1/models", headers=auth(KEY))).json()["data"]
    route = next(card for card in cards if card["id"] == "chat")
    assert route["llmso"]["split"] == {"a": 1.0, "b": 1.0} and route["llmso"]["sticky"]
    listed = (await gateway.http.get("/v1/models", headers=auth(KEY + "-c"))).json()["data"]
    assert [card["id"] for card in listed] == ["c"]
    one = await gateway.http.get("/v1/models/chat", headers=auth(KEY + "-b"))
    assert one.status_code == 200 and one.json()["id"] == "chat"


# --------------------------------------------------------------------------- mirrors


async def test_mirrored_requests_reach_the_shadow_but_never_the_client(start: Start) -> None:
    """The client gets the same bytes as without the mirror (ids and timestamps aside), and
    its key is charged the primary alone; the shadow gets the chosen copies, same body."""
    auth = {"required": True, "keys": [{"name": "team", "key": KEY, "tokens_per_day": 10**6}]}
    knobs = {"shadow": {"marker": "SHADOW"}}
    plain = await start(config("a", "shadow", auth=auth), **knobs)
    mirror = {"model": "shadow", "share": 0.5, "max_inflight": 64}
    mirroring = await start(config("a", "shadow", auth=auth, mirror=mirror), **knobs)
    headers = {"authorization": f"Bearer {KEY}"}
    ids = [f"m-{i}" for i in range(40)]
    chosen = [rid for rid in ids if mirrored(rid, 0.5)]
    assert 10 < len(chosen) < 30  # the test below counts something
    for rid in ids:
        stream = rid.endswith(("1", "3", "5"))
        fields = {"model": "a", "max_tokens": 8, "stream": stream}
        one = await chat(plain, rid, headers=headers, **fields)
        two = await chat(mirroring, rid, headers=headers, **fields)
        assert normalised(two.content) == normalised(one.content)
        assert b"SHADOW" not in two.content
    await wait_until(lambda: mirroring.mirrors("ok") == len(chosen))
    shadow = mirroring.backends["shadow"].requests
    assert sorted(r.request_id for r in shadow) == sorted(f"{rid}-mirror" for rid in chosen)
    primary = {r.request_id: r for r in mirroring.backends["a"].requests}
    for copy in shadow:
        original = primary[copy.request_id.removesuffix("-mirror")]
        assert (copy.messages, copy.sampling) == (original.messages, original.sampling)
    assert plain.served("shadow") == 0
    # Usage and limits: the same for both keys, the copies nowhere.
    usage = [
        (await gw.http.get("/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})).json()
        for gw in (plain, mirroring)
    ]
    (before,), (after,) = usage[0]["keys"], usage[1]["keys"]
    assert after["requests"] == before["requests"] == {"ok": 40}
    assert after["tokens"] == before["tokens"]
    assert after["today"]["tokens_used"] == before["today"]["tokens_used"] > 0
    shadow_tokens = mirroring.sample(
        "llmso_mirror_generation_tokens_total", model="a", shadow="shadow"
    )
    assert shadow_tokens == 3 * len(chosen)  # the fake echoes the prompt's three words
    copies = mirroring.sample(
        "llmso_requests_total",
        model="shadow",
        backend="openai",
        status="ok",
        endpoint="mirror:/v1/chat/completions",
    )
    assert copies == len(chosen)


async def test_a_failing_shadow_does_not_affect_the_primary(start: Start) -> None:
    mirror = {"model": "shadow", "share": 1.0, "max_inflight": 64}
    gateway = await start(config("a", "shadow", mirror=mirror), shadow={"down": True})
    plain = await start(config("a", "shadow"))
    for i in range(20):
        one = await chat(gateway, f"f{i}", model="a", stream=bool(i % 2))
        two = await chat(plain, f"f{i}", model="a", stream=bool(i % 2))
        assert normalised(one.content) == normalised(two.content)
    await wait_until(lambda: gateway.mirrors("error") == 20)
    assert gateway.mirrors("ok") == 0 and gateway.served("shadow") == 20


async def test_mirrors_are_bounded_per_model_and_cancelled_at_shutdown(start: Start) -> None:
    mirror = {"model": "shadow", "share": 1.0, "max_inflight": 2}
    gateway = await start(config("a", "shadow", mirror=mirror), shadow={"delay": 5.0})
    for i in range(6):
        await chat(gateway, f"b{i}", model="a")  # answered at once, the shadow is slow
    assert gateway.mirrors("dropped") == 4
    await wait_until(lambda: gateway.backends.get("shadow") is not None)
    shadow = gateway.backends["shadow"]
    await wait_until(lambda: shadow.running == 2)
    await gateway.close()
    assert gateway.mirrors("cancelled") == 2
    assert shadow.aborted == 2 and shadow.running == 0


# --------------------------------------------------------------------------- reload


async def test_hot_reload_changes_weights_and_mirrors(start: Start, tmp_path: Path) -> None:
    path = tmp_path / "llmso.yaml"

    def write(weights: dict[str, int], mirror: dict[str, Any] | None) -> None:
        extra = {"b": {"mirror": mirror}} if mirror else {}
        raw = {"models": models("a", "b", "shadow", **extra), "routes": split(**weights)}
        path.write_text(yaml.safe_dump(raw))

    write({"a": 100, "b": 1}, None)
    gateway = await start(load_config(path), watch=True)

    async def targets(prefix: str) -> Counter[str]:
        return Counter([(await chat(gateway, f"{prefix}{i}")).json()["model"] for i in range(40)])

    assert (await targets("x"))["a"] >= 36
    write({"a": 1, "b": 100}, {"model": "shadow", "share": 1.0, "max_inflight": 64})

    async def reloaded() -> bool:
        card = (await gateway.http.get("/v1/models/chat")).json()
        return bool(card["llmso"]["split"] == {"a": 1.0, "b": 100.0})

    for _ in range(60):  # the watcher polls the file about once a second
        if await reloaded():
            break
        await asyncio.sleep(0.1)
    after = await targets("y")
    assert after["b"] >= 36
    await wait_until(lambda: gateway.mirrors("ok", model="b") == after["b"])
    assert gateway.served("shadow") == after["b"]
