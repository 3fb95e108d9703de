"""The bare passthrough peer relays both answer kinds unchanged (it is a benchmark floor,
so it must do the same work as a minimal gateway, no less)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from bench.bare_passthrough import build
from bench.fake_upstream import FakeUpstream


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.stop()


async def test_relays_streamed_and_plain_answers(upstream: FakeUpstream) -> None:
    app = build(f"http://127.0.0.1:{upstream.port}", upstream.options.model)
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            plain = await client.post("/v1/chat/completions", json=body)
            streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert plain.status_code == 200
    assert plain.json()["choices"][0]["finish_reason"] == "length"
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.text.rstrip().endswith("data: [DONE]")
    assert upstream.bodies[-1]["model"] == upstream.options.model
