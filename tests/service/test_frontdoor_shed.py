"""Saturation sheds (issue 41): past ``server.max_in_flight`` requests in flight, or while
the event loop runs later than ``server.shed_loop_lag_ms``, a new one gets 503 with
``Retry-After`` at once, in its route's envelope, and is counted; the requests already in
flight finish untouched. In-process over ASGI with the echo backend
(``tests.tools.frontdoor_app``), whose ``hold`` prompt keeps a request open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import anthropic
import httpx2
import openai
import pytest

from tests.tools.frontdoor_app import AppFactory, chat, make_config, metric


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():  # noqa: ASYNC110 - the door counts, it offers no event
            await asyncio.sleep(0.01)


async def test_past_the_ceiling_new_requests_are_shed_and_admitted_ones_finish(
    make_app: AppFactory,
) -> None:
    app = await make_app(make_config(server={"max_in_flight": 2}))
    door = app.asgi.state.door
    held = [
        asyncio.create_task(app.http.post("/v1/chat/completions", json=chat(content="hold")))
        for _ in range(2)
    ]
    await _until(lambda: door.inflight == 2)

    openai = await app.http.post("/v1/chat/completions", json=chat())
    assert openai.status_code == 503
    assert openai.headers["retry-after"] == "1"
    error = openai.json()["error"]
    assert error["code"] == "gateway_saturated" and error["type"] == "service_unavailable"
    assert "server.max_in_flight" in error["message"]

    anthropic = await app.http.post(
        "/v1/messages",
        json={"model": "alpha", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
    )
    assert anthropic.status_code == 503
    assert anthropic.headers["retry-after"] == "1"
    body = anthropic.json()
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"

    app.backends["alpha"].release.set()
    answers = await asyncio.gather(*held)
    assert [a.status_code for a in answers] == [200, 200]
    assert all(a.json()["choices"][0]["message"]["content"] == " tok tok tok" for a in answers)
    assert door.inflight == 0

    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_shed_requests_total", endpoint="/v1/chat/completions") == 1
    assert metric(text, "llmso_shed_requests_total", endpoint="/v1/messages") == 1
    # Shed before any accounting: only the two held requests are in the request counts.
    assert metric(text, "llmso_requests_total") == 2
    # Below the ceiling again: served.
    assert (await app.http.post("/v1/chat/completions", json=chat())).status_code == 200


async def test_the_default_ceiling_leaves_ordinary_load_alone(make_app: AppFactory) -> None:
    app = await make_app(make_config())
    assert app.asgi.state.door.max_in_flight == 2048
    answers = await asyncio.gather(
        *(app.http.post("/v1/chat/completions", json=chat()) for _ in range(64))
    )
    assert {a.status_code for a in answers} == {200}


async def _busy(stop: asyncio.Event, slice_s: float = 0.08) -> None:
    """Keep the event loop busy, as a saturated relay does: it runs other callbacks only
    between slices."""
    while not stop.is_set():
        time.sleep(slice_s)  # noqa: ASYNC251 - the point: the loop is held
        await asyncio.sleep(0)


async def test_while_the_loop_runs_late_new_requests_are_shed(make_app: AppFactory) -> None:
    app = await make_app(make_config(server={"shed_loop_lag_ms": 10}))
    door = app.asgi.state.door
    assert door.lag is not None and door.lag.share == 0
    assert (await app.http.post("/v1/chat/completions", json=chat())).status_code == 200

    stop = asyncio.Event()
    busy = asyncio.create_task(_busy(stop))
    try:
        await _until(lambda: door.lag.share >= 1.0)  # twice the limit: every new one
        shed = await app.http.post("/v1/chat/completions", json=chat())
        lag_gauge = metric((await app.http.get("/metrics")).text, "llmso_event_loop_lag_seconds")
    finally:
        stop.set()
        await busy
    assert shed.status_code == 503
    assert shed.headers["retry-after"] == "1"
    error = shed.json()["error"]
    assert error["code"] == "gateway_saturated"
    assert "server.shed_loop_lag_ms" in error["message"]
    assert lag_gauge > 0.03

    await _until(lambda: door.lag.share == 0)
    assert (await app.http.post("/v1/chat/completions", json=chat())).status_code == 200
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_shed_requests_total", endpoint="/v1/chat/completions") == 1


async def test_by_default_a_late_loop_is_measured_not_shed(make_app: AppFactory) -> None:
    app = await make_app(make_config())
    door = app.asgi.state.door
    stop = asyncio.Event()
    busy = asyncio.create_task(_busy(stop))
    try:
        await _until(lambda: door.lag.seconds > 0.03)
        answer = await app.http.post("/v1/chat/completions", json=chat())
    finally:
        stop.set()
        await busy
    assert answer.status_code == 200
    assert door.lag.share == 0


async def test_the_sdks_see_a_lag_shed_as_their_own_503(make_app: AppFactory) -> None:
    """The OpenAI and Anthropic SDKs (no retries) get the shed as a 503 status error
    carrying the route's own error body."""
    app = await make_app(make_config(server={"shed_loop_lag_ms": 10}))
    door = app.asgi.state.door
    sdk = openai.AsyncOpenAI(base_url="http://t/v1", api_key="x", http_client=app.http)
    transport = httpx2.ASGITransport(app=app.asgi)
    async with httpx2.AsyncClient(transport=transport, base_url="http://t") as h2:
        claude = anthropic.AsyncAnthropic(
            api_key="x", base_url="http://t", http_client=h2, max_retries=0
        )
        stop = asyncio.Event()
        busy = asyncio.create_task(_busy(stop))
        try:
            await _until(lambda: door.lag.share >= 1.0)
            with pytest.raises(openai.APIStatusError) as shed_openai:
                await sdk.with_options(max_retries=0).chat.completions.create(
                    model="alpha", messages=[{"role": "user", "content": "x"}]
                )
            with pytest.raises(anthropic.APIStatusError) as shed_claude:
                await claude.messages.create(
                    model="alpha", max_tokens=4, messages=[{"role": "user", "content": "x"}]
                )
        finally:
            stop.set()
            await busy
    assert shed_openai.value.status_code == 503
    assert shed_openai.value.code == "gateway_saturated"
    assert shed_openai.value.response.headers["retry-after"] == "1"
    assert shed_claude.value.status_code == 503
    body = shed_claude.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "overloaded_error"
