"""Service tier for spend: the app in-process with priced models. A key with a budget
is refused once it is spent (429 ``budget_exceeded`` in each route's envelope, with
``Retry-After`` at the period's end), a stream cut short is charged what it generated,
``x-llmso-cost`` on whole answers, the cost in the request log and in
``llmso_spend_total``, ``/admin/usage``; and cached prompt tokens reported by an upstream
reach the usage of all three APIs and are priced at the cached rate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from backends.base import Backend
from bench.fake_upstream import FakeOptions, FakeUpstream
from config.pricing import PricingConfig
from config.schema import AppConfig, ModelConfig
from gateway.access.admission import estimate_prompt_tokens
from gateway.access.periods import DAY, bounds
from gateway.app import build_app
from gateway.observe.cost import cost_pico, per_token, usd, usd_text
from tests.service.test_embeddings_api import ScriptedEmbedder
from tests.tools.frontdoor_app import (
    ADMIN,
    JSON_HEADERS,
    KEY_A,
    KEY_B,
    PROMPT_TOKENS,
    AppFactory,
    bearer,
    chat,
    drive,
    keys,
    make_config,
    metric,
    team,
)
from tests.tools.schemas import validate
from tests.tools.sse import named_events

PRICES = {"input": 100.0, "cached_input": 25.0, "output": 200.0}  # USD per million tokens
ONE_ANSWER = "0.0013"  # 7 prompt tokens x 100 + 3 completion tokens x 200, per million


def priced_config(**sections: Any) -> AppConfig:
    models = [
        {"name": "alpha", "backend": "openai", "base_url": "http://u", "pricing": PRICES},
        {"name": "beta", "backend": "openai", "base_url": "http://u"},  # no prices
    ]
    return make_config(models=models, **sections)


def logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "llmso.requests"]


async def test_a_key_with_a_budget_is_refused_once_it_is_spent(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmso.requests")
    spender = team("team-a", KEY_A, max_budget=0.003, budget_period="day")
    app = await make_app(priced_config(**keys(spender, team("team-b", KEY_B))))
    auth = bearer(KEY_A)
    answers = [
        await app.http.post("/v1/chat/completions", json=chat(max_tokens=3), headers=auth)
        for _ in range(4)
    ]
    # 0.0013 each: the third starts at 0.0026 (< 0.003) and is let in, the fourth is not.
    assert [r.status_code for r in answers] == [200, 200, 200, 429]
    assert [r.headers["x-llmso-cost"] for r in answers[:3]] == [ONE_ANSWER] * 3
    refused = answers[3]
    assert "x-llmso-cost" not in refused.headers
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("budget_exceeded", "budget_exceeded")
    midnight = bounds(time.time(), "day")[1] * DAY
    resets = datetime.fromtimestamp(midnight, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "daily max_budget of $0.003" in error["message"] and resets in error["message"]
    assert "$0.0039 of" in error["message"]
    assert abs(int(refused.headers["retry-after"]) - (midnight - time.time())) <= 5

    # The Messages route refuses in Anthropic's envelope, naming the same budget.
    message = {"model": "alpha", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    anthropic = await app.http.post("/v1/messages", json=message, headers=auth)
    assert anthropic.status_code == 429 and "retry-after" in anthropic.headers
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "rate_limit_error"
    assert "max_budget" in anthropic.json()["error"]["message"]

    # Another key is not affected; a model without prices costs nothing.
    other = await app.http.post(
        "/v1/chat/completions", json=chat(max_tokens=3), headers=bearer(KEY_B)
    )
    assert other.status_code == 200 and other.headers["x-llmso-cost"] == ONE_ANSWER
    free = await app.http.post(
        "/v1/chat/completions", json=chat("beta", max_tokens=3), headers=bearer(KEY_B)
    )
    assert free.status_code == 200 and free.headers["x-llmso-cost"] == "0"

    usage = (await app.http.get("/admin/usage", headers=bearer(ADMIN))).json()
    entries = {entry["name"]: entry for entry in usage["keys"]}
    spent = entries["team-a"]
    assert spent["limits"]["max_budget"] == 0.003
    assert spent["limits"]["budget_period"] == "day"
    budget = spent["budget"]
    assert budget["period"] == "day" and budget["max_budget"] == 0.003
    assert budget["spent"] == pytest.approx(0.0039) and budget["left"] == 0
    assert budget["resets_at"] == resets
    assert abs(budget["resets_in_s"] - (midnight - time.time())) <= 5
    assert spent["spend"] == {
        "usd": pytest.approx(0.0039),
        "by_model": {"alpha": pytest.approx(0.0039)},
    }
    assert entries["team-b"]["budget"] is None  # no max_budget: no store-side spend
    assert entries["team-b"]["spend"]["by_model"] == {"alpha": pytest.approx(0.0013)}
    assert usage["spend_by_model"] == {"alpha": pytest.approx(0.0052)}

    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_spend_total", model="alpha", key="team-a") == pytest.approx(0.0039)
    assert metric(text, "llmso_spend_total", model="alpha", key="team-b") == pytest.approx(0.0013)
    assert metric(text, "llmso_spend_total", key="team-a", model="beta") == 0

    costs = [(entry["key"], entry["model"], entry["cost_usd"]) for entry in logged(caplog)]
    assert costs[:3] == [("team-a", "alpha", pytest.approx(0.0013))] * 3
    assert costs[3][2] is None  # refused before any model answered: no cost
    assert costs[-1] == ("team-b", "beta", None)  # no prices: the log says so


async def test_a_stream_cut_short_is_charged_what_it_generated(
    make_app: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmso.requests")
    app = await make_app(priced_config(**keys(team("team-a", KEY_A, max_budget=1.0))))
    headers = [*JSON_HEADERS, (b"authorization", f"Bearer {KEY_A}".encode())]
    body = orjson.dumps(chat(content="hold", max_tokens=900, stream=True))
    request = {"type": "http.request", "body": body, "more_body": False}
    # The client leaves after the first token; the backend holds the second.
    status, sent_headers, _ = await drive(
        app.asgi, "/v1/chat/completions", headers, [request, 0.3, {"type": "http.disconnect"}]
    )
    assert status == 200 and b"x-llmso-cost" not in sent_headers  # a stream: cost at its end
    prompt = estimate_prompt_tokens(app.backends["alpha"].calls[-1])
    expected = prompt * per_token(PRICES["input"]) + 1 * per_token(PRICES["output"])
    admission = app.asgi.state.admission
    client = admission.keys.clients()[0]
    verdict = await admission.store.peek(client.name, client.limits)
    assert verdict.spent == expected  # charged to the budget: the prompt and one token
    [entry] = logged(caplog)
    assert entry["status"] == "disconnected" and entry["cost_usd"] == pytest.approx(usd(expected))
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_spend_total", key="team-a") == pytest.approx(usd(expected))


async def test_a_whole_stream_is_charged_its_usage(make_app: AppFactory) -> None:
    app = await make_app(priced_config(**keys(team("team-a", KEY_A, max_budget=1.0))))
    streamed = await app.http.post(
        "/v1/chat/completions", json=chat(max_tokens=3, stream=True), headers=bearer(KEY_A)
    )
    assert streamed.status_code == 200 and "x-llmso-cost" not in streamed.headers
    admission = app.asgi.state.admission
    client = admission.keys.clients()[0]
    verdict = await admission.store.peek(client.name, client.limits)
    pricing = PricingConfig(**PRICES)
    assert verdict.spent == cost_pico(pricing, PROMPT_TOKENS, 0, 3)


async def test_embeddings_are_priced_on_their_input() -> None:
    model = {"name": "embedder", "backend": "openai", "base_url": "http://x"}
    config = AppConfig.model_validate(
        {"models": [{**model, "pricing": {"input": 0.02, "output": 99.0}}]}
    )

    def factory(model: ModelConfig, _on_crash: Any) -> Backend:
        return ScriptedEmbedder(model)  # type: ignore[return-value]

    app = build_app(config, backend_factory=factory)
    transport = httpx.ASGITransport(app=app)
    async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        response = await c.post(
            "/v1/embeddings", json={"model": "embedder", "input": ["abcd", "ef"]}
        )
        assert response.status_code == 200
        assert response.json()["usage"]["prompt_tokens"] == 6
        assert response.headers["x-llmso-cost"] == "0.00000012"  # 6 x 0.02 per million


# --------------------------------------------------------------------------- cached tokens


CACHED = 4
UPSTREAM_PRICES = {"input": 1.0, "cached_input": 0.1, "output": 2.0}
PROMPT = "one two three four five six seven"


@pytest.fixture
async def relayed() -> AsyncIterator[httpx.AsyncClient]:
    """The app relaying to a fake upstream that reports ``CACHED`` cached prompt tokens."""
    async with FakeUpstream(FakeOptions(chunks=3, cached_tokens=CACHED)) as upstream:
        model = {
            "name": "up",
            "backend": "openai",
            "base_url": upstream.url + "/v1",
            "upstream_model": "fake-model",
            "pricing": UPSTREAM_PRICES,
        }
        app = build_app(AppConfig.model_validate({"models": [model]}))
        transport = httpx.ASGITransport(app=app)
        async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            yield c


def expected_cost(prompt: int, completion: int) -> str:
    pricing = PricingConfig(**UPSTREAM_PRICES)
    return usd_text(cost_pico(pricing, prompt, CACHED, completion))


async def test_cached_tokens_in_chat_usage_and_at_the_cached_price(
    relayed: httpx.AsyncClient,
) -> None:
    body = {"model": "up", "messages": [{"role": "user", "content": PROMPT}]}
    whole = await relayed.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    validate("CreateChatCompletionResponse", whole.json())
    usage = whole.json()["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": CACHED}
    assert usage["prompt_tokens"] > CACHED
    assert whole.headers["x-llmso-cost"] == expected_cost(
        usage["prompt_tokens"], usage["completion_tokens"]
    )
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    streamed = await relayed.post("/v1/chat/completions", json=stream)
    chunks = [
        orjson.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")
    ]
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}
    legacy = await relayed.post("/v1/completions", json={"model": "up", "prompt": PROMPT})
    assert legacy.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": CACHED}


async def test_cached_tokens_in_responses_usage(relayed: httpx.AsyncClient) -> None:
    body = {"model": "up", "input": PROMPT}
    whole = (await relayed.post("/v1/responses", json=body)).json()
    validate("Response", whole)
    assert whole["usage"]["input_tokens_details"] == {
        "cached_tokens": CACHED,
        "cache_write_tokens": 0,
    }
    streamed = await relayed.post("/v1/responses", json={**body, "stream": True})
    final = named_events(streamed.text)[-1]["response"]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == CACHED


async def test_cached_tokens_in_messages_usage(relayed: httpx.AsyncClient) -> None:
    body = {"model": "up", "max_tokens": 8, "messages": [{"role": "user", "content": PROMPT}]}
    whole = (await relayed.post("/v1/messages", json=body)).json()
    chat_usage = (
        await relayed.post(
            "/v1/chat/completions",
            json={"model": "up", "max_tokens": 8, "messages": body["messages"]},
        )
    ).json()["usage"]
    # Anthropic's split: input_tokens are the prompt tokens not read from the cache.
    assert whole["usage"] == {
        "input_tokens": chat_usage["prompt_tokens"] - CACHED,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": CACHED,
        "output_tokens": chat_usage["completion_tokens"],
    }
    streamed = await relayed.post("/v1/messages", json={**body, "stream": True})
    delta = next(e for e in named_events(streamed.text) if e["type"] == "message_delta")
    assert delta["usage"]["cache_read_input_tokens"] == CACHED


async def test_an_upstream_without_usage_is_charged_the_tokens_the_gateway_counted() -> None:
    async with FakeUpstream(FakeOptions(chunks=3, usage=False)) as upstream:
        model = {
            "name": "up",
            "backend": "openai",
            "base_url": upstream.url + "/v1",
            "upstream_model": "fake-model",
            "pricing": UPSTREAM_PRICES,
        }
        app = build_app(AppConfig.model_validate({"models": [model]}))
        transport = httpx.ASGITransport(app=app)
        async with app.lifespan(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            body = {"model": "up", "messages": [{"role": "user", "content": PROMPT}]}
            answer = await c.post("/v1/chat/completions", json=body)
    usage = answer.json()["usage"]
    # Three chunks counted as three tokens; the prompt estimated (~4 characters a token).
    assert usage["completion_tokens"] == 3 and usage["prompt_tokens"] > 0
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    pricing = PricingConfig(**UPSTREAM_PRICES)
    expected = cost_pico(pricing, usage["prompt_tokens"], 0, 3)
    assert answer.headers["x-llmso-cost"] == usd_text(expected)
