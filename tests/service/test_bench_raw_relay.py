"""The raw-relay floor passes both answer kinds through byte for byte (it is a benchmark
floor: it must do the least a relay can, and still relay correctly)."""

from __future__ import annotations

import httpx

from bench.fake_upstream import FakeUpstream
from bench.raw_relay import RawRelay


async def test_relays_streamed_and_plain_answers_unchanged() -> None:
    fake = FakeUpstream()
    await fake.start()
    relay = RawRelay(f"http://127.0.0.1:{fake.port}")
    model = fake.options.model
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        transport = httpx.ASGITransport(app=relay)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://t") as client,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{fake.port}") as direct,
        ):
            for stream in (False, True):
                sent = {**body, "stream": stream}
                relayed = await client.post("/v1/chat/completions", json=sent)
                straight = await direct.post("/v1/chat/completions", json=sent)
                assert relayed.status_code == straight.status_code == 200
                assert relayed.content == straight.content
                kind = relayed.headers["content-type"]
                assert kind.startswith("text/event-stream" if stream else "application/json")
            assert fake.bodies[-1] == {**body, "stream": True}  # the body went up as it came
            assert (await client.get("/health")).text == "ok"
            assert (await client.post("/v1/embeddings", json={})).status_code == 404
    finally:
        await relay.close()
        await fake.stop()
