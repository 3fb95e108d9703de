"""Saturation sheds (issue 41): past ``server.max_in_flight`` requests in flight, a new
one gets 503 with ``Retry-After`` at once, in its route's envelope, and is counted;
the requests already in flight finish untouched. In-process over ASGI with the echo
backend (``tests.tools.frontdoor_app``), whose ``hold`` prompt keeps a request open."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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
