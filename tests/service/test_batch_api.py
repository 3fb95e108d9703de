"""``/v1/files`` and ``/v1/batches`` in-process with the echo backend, driven by the
official ``openai`` SDK over ASGI: a batch's lines run through the online endpoints,
charged to the key that created it; bad input files fail the batch as OpenAI's do; a
cancel; a batch resumed by a second app on the same state directory; leases; limits;
lines charged at the batch discount."""

from __future__ import annotations

import asyncio
import io
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from gateway.access.periods import DAY, bounds
from gateway.batch.objects import Batch
from gateway.batch.store import BatchState
from tests.tools.frontdoor_app import (
    ADMIN,
    KEY_A,
    KEY_B,
    App,
    AppFactory,
    app_factory,
    keys,
    make_config,
    metric,
    team,
)


@pytest.fixture
async def make() -> AsyncIterator[AppFactory]:
    async with app_factory() as factory:
        yield factory


def batch_config(directory: Path, **fields: Any) -> dict[str, Any]:
    return {
        "batch": {"directory": str(directory), "poll_interval": 0.02, "lease_seconds": 2.0}
        | fields,
        **keys(team("team-a", KEY_A), team("team-b", KEY_B)),
    }


def sdk(app: App, key: str = KEY_A) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app.asgi), base_url="http://t")
    return openai.AsyncOpenAI(base_url="http://t/v1", api_key=key, http_client=http)


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    return b"".join((x.encode() if isinstance(x, str) else orjson.dumps(x)) + b"\n" for x in lines)


def chat_line(custom_id: str, content: str = "hi", model: str = "alpha") -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


async def wait_for(client: openai.AsyncOpenAI, batch_id: str, *statuses: str) -> Any:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch {batch_id} stayed {batch.status}")


async def until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def submit(client: openai.AsyncOpenAI, data: bytes, **fields: Any) -> Any:
    file = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    return await client.batches.create(
        input_file_id=file.id,
        endpoint=fields.pop("endpoint", "/v1/chat/completions"),
        completion_window="24h",
        **fields,
    )


async def read_lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [orjson.loads(line) for line in content.content.splitlines()]


async def test_a_batch_runs_its_lines_through_the_endpoints_charged_to_its_key(
    make: AppFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make(make_config(**batch_config(tmp_path)))
    client = sdk(app)
    lines = [chat_line(f"req-{i}") for i in range(5)] + [chat_line("lost", model="nope")]
    caplog.set_level(logging.INFO, logger="llmso.requests")
    created = await submit(client, jsonl(*lines), metadata={"job": "nightly"})
    assert created.status == "validating"
    done = await wait_for(client, created.id, "completed")
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (6, 5)
    assert done.request_counts.failed == 1
    assert done.metadata == {"job": "nightly"}
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    outputs = await read_lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in outputs) == [f"req-{i}" for i in range(5)]
    for line in outputs:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] == " tok tok"
    (error,) = await read_lines(client, done.error_file_id)
    assert error["custom_id"] == "lost"
    assert error["response"]["status_code"] == 404
    assert error["response"]["body"]["error"]["code"] == "model_not_found"
    # Each line went through the front door as team-a, at the lowest priority.
    calls = app.backends["alpha"].calls
    assert len(calls) == 5 and {call.priority for call in calls} == {2}
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_key_requests_total", key="team-a") == 6
    assert metric(text, "llmso_key_tokens_total", key="team-a", type="completion") == 10
    series = {"endpoint": "batch:/v1/chat/completions"}
    assert metric(text, "llmso_requests_total", model="alpha", status="ok", **series) == 5
    assert metric(text, "llmso_requests_total", model="unrouted", **series) == 1
    await app.http.post(
        "/v1/chat/completions",
        json=chat_line("x")["body"],
        headers={"authorization": f"Bearer {KEY_A}"},
    )
    text = (await app.http.get("/metrics")).text
    online = {"endpoint": "/v1/chat/completions"}
    assert metric(text, "llmso_requests_total", model="alpha", status="ok", **online) == 1
    logged = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "llmso.requests"]
    batch_lines = [entry for entry in logged if entry["batch_id"] == created.id]
    assert len(batch_lines) == 6
    assert {entry["endpoint"] for entry in batch_lines} == {"/v1/chat/completions"}
    # Another key sees neither the batch nor its files.
    other = sdk(app, KEY_B)
    with pytest.raises(openai.NotFoundError):
        await other.batches.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        await other.files.content(done.output_file_id)
    assert [b.id for b in (await client.batches.list()).data] == [created.id]


async def test_completions_lines_and_a_streamed_line(make: AppFactory, tmp_path: Path) -> None:
    app = await make(make_config(**batch_config(tmp_path)))
    client = sdk(app)
    body = {"model": "alpha", "prompt": "once", "max_tokens": 3}
    line = {"method": "POST", "url": "/v1/completions"}
    lines = [line | {"custom_id": "a", "body": body}]
    lines.append(line | {"custom_id": "b", "body": body | {"stream": True}})
    created = await submit(client, jsonl(*lines), endpoint="/v1/completions")
    done = await wait_for(client, created.id, "completed")
    (ok,) = await read_lines(client, done.output_file_id)
    assert ok["custom_id"] == "a" and ok["response"]["body"]["choices"][0]["text"] == " tok tok tok"
    (refused,) = await read_lines(client, done.error_file_id)
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "stream"


async def test_lines_refused_by_the_keys_limits_wait_and_run(
    make: AppFactory, tmp_path: Path
) -> None:
    """Three lines at once against a key allowed one request in flight: the refused ones
    wait for their Retry-After and run; none ends in the error file."""
    config = batch_config(tmp_path, max_concurrency=3)
    config.update(keys(team("team-a", KEY_A, max_parallel=1)))
    app = await make(make_config(**config))
    client = sdk(app)
    lines = [chat_line("p-0", "hold"), chat_line("p-1"), chat_line("p-2")]
    created = await submit(client, jsonl(*lines))

    async def refused() -> float:
        text = (await app.http.get("/metrics")).text
        return metric(text, "llmso_key_requests_total", key="team-a", status="client_error")

    for _ in range(500):  # both others refused while the first holds its slot
        if await refused() >= 2:
            break
        await asyncio.sleep(0.02)
    assert await refused() >= 2
    app.backends["alpha"].release.set()
    done = await wait_for(client, created.id, "completed")
    assert done.request_counts is not None and done.request_counts.completed == 3
    assert done.error_file_id is None
    text = (await app.http.get("/metrics")).text
    assert metric(text, "llmso_key_requests_total", key="team-a", status="ok") == 3


async def test_no_line_starts_while_online_requests_fill_the_pause_limit(
    make: AppFactory, tmp_path: Path
) -> None:
    app = await make(make_config(**batch_config(tmp_path, pause_when_online=1)))
    client = sdk(app)
    await until(lambda: "alpha" in app.backends)
    online = asyncio.create_task(
        client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hold"}], max_tokens=3
        )
    )
    await until(lambda: len(app.backends["alpha"].calls) == 1)
    created = await submit(client, jsonl(chat_line("a"), chat_line("b")))
    await wait_for(client, created.id, "in_progress")
    await asyncio.sleep(0.3)
    assert len(app.backends["alpha"].calls) == 1  # the batch waits for the online request
    app.backends["alpha"].release.set()
    await online
    done = await wait_for(client, created.id, "completed")
    assert done.request_counts is not None and done.request_counts.completed == 2


async def test_a_bad_input_file_fails_the_batch_naming_each_line(
    make: AppFactory, tmp_path: Path
) -> None:
    app = await make(make_config(**batch_config(tmp_path)))
    client = sdk(app)
    wrong_url = chat_line("b") | {"url": "/v1/embeddings"}
    data = jsonl(chat_line("a"), "{not json", wrong_url, chat_line("a"), chat_line("c"))
    created = await submit(client, data)
    failed = await wait_for(client, created.id, "failed")
    assert failed.errors is not None and failed.failed_at
    found = [(e.code, e.line, e.param) for e in failed.errors.data or []]
    assert found == [
        ("invalid_json_line", 2, None),
        ("invalid_url", 3, "url"),
        ("duplicate_custom_id", 4, "custom_id"),
    ]
    assert app.backends["alpha"].calls == []


async def test_create_refuses_bad_fields_in_the_envelope(make: AppFactory, tmp_path: Path) -> None:
    app = await make(make_config(**batch_config(tmp_path, max_file_bytes=64)))
    client = sdk(app)
    with pytest.raises(openai.APIStatusError) as too_big:
        await client.files.create(file=("x.jsonl", io.BytesIO(b"x" * 65)), purpose="batch")
    assert too_big.value.status_code == 413
    assert "64 bytes" in too_big.value.message
    with pytest.raises(openai.BadRequestError) as purpose:
        await client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="assistants")
    assert purpose.value.body["param"] == "purpose"  # type: ignore[index]
    file = await client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
    for fields, param in (
        ({"endpoint": "/v1/moderations"}, "endpoint"),
        ({"completion_window": "1h"}, "completion_window"),
        ({"input_file_id": "file-nope"}, "input_file_id"),
    ):
        args = {"input_file_id": file.id, "endpoint": "/v1/chat/completions"}
        args |= {"completion_window": "24h"} | fields
        with pytest.raises(openai.BadRequestError) as refused:
            await client.batches.create(**args)
        assert refused.value.body["param"] == param  # type: ignore[index]
    assert [f.id for f in (await client.files.list()).data] == [file.id]
    assert (await client.files.retrieve(file.id)).bytes == 3
    assert (await client.files.delete(file.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(file.id)
    unauthorized = await app.http.get("/v1/batches")
    assert unauthorized.status_code == 401
    assert unauthorized.json()["error"]["code"] == "invalid_api_key"


async def test_cancel_stops_starting_lines_and_keeps_what_finished(
    make: AppFactory, tmp_path: Path
) -> None:
    app = await make(make_config(**batch_config(tmp_path, max_concurrency=1)))
    client = sdk(app)
    lines = [chat_line("first", "hold"), *(chat_line(f"later-{i}") for i in range(3))]
    created = await submit(client, jsonl(*lines))
    await wait_for(client, created.id, "in_progress")
    await until(lambda: bool(app.backends["alpha"].calls))
    cancelling = await client.batches.cancel(created.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    app.backends["alpha"].release.set()
    cancelled = await wait_for(client, created.id, "cancelled")
    assert cancelled.cancelled_at
    assert cancelled.request_counts is not None
    assert (cancelled.request_counts.total, cancelled.request_counts.completed) == (4, 1)
    assert [line["custom_id"] for line in await read_lines(client, cancelled.output_file_id)] == [
        "first"
    ]
    assert len(app.backends["alpha"].calls) == 1


async def test_a_batch_cut_short_is_resumed_by_the_next_gateway(
    make: AppFactory, tmp_path: Path
) -> None:
    """The first app stops while a line is held in the backend; a second app on the same
    directory runs the rest, the cut line again (counted), and no line twice."""
    config = make_config(**batch_config(tmp_path, max_concurrency=2))
    first = await make(config)
    client = sdk(first)
    lines = [chat_line("a"), chat_line("b", "hold"), chat_line("c", "hold"), chat_line("d")]
    created = await submit(client, jsonl(*lines))
    await until(lambda: len(first.backends["alpha"].calls) == 3)  # a done, b and c held
    await first.asgi.api.state.batch_runner.stop()
    second = await make(config)
    await until(lambda: "alpha" in second.backends)  # preloaded in the background
    second.backends["alpha"].release.set()
    second_client = sdk(second)
    done = await wait_for(second_client, created.id, "completed")
    outputs = await read_lines(second_client, done.output_file_id)
    assert sorted(line["custom_id"] for line in outputs) == ["a", "b", "c", "d"]
    assert done.metadata == {"llmso_reruns": "2"}
    assert sorted(c.messages[-1].content for c in second.backends["alpha"].calls) == [
        "hi",
        "hold",
        "hold",
    ]


async def test_one_replica_at_a_time_holds_a_batch(tmp_path: Path) -> None:
    state = BatchState(tmp_path)
    await state.add_batch(
        Batch(
            id="batch_x",
            owner="k",
            endpoint="/v1/completions",
            input_file_id="f",
            created_at=int(time.time()),
        )
    )
    assert await state.claim("replica-1", 0.3) is not None
    assert await state.claim("replica-2", 0.3) is None
    assert await state.renew("batch_x", "replica-1", 0.3)
    await asyncio.sleep(0.4)
    claimed = await state.claim("replica-2", 5.0)
    assert claimed is not None and claimed.id == "batch_x"
    assert not await state.renew("batch_x", "replica-1", 5.0)
    state.close()


async def test_a_runner_whose_lease_was_taken_writes_nothing_more(
    make: AppFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = await make(make_config(**batch_config(tmp_path, max_concurrency=1)))
    client = sdk(app)
    created = await submit(client, jsonl(chat_line("a", "hold"), chat_line("b")))
    await until(lambda: len(app.backends["alpha"].calls) == 1)
    with sqlite3.connect(tmp_path / "batches.sqlite3") as db:  # another replica took it
        db.execute(
            "UPDATE batches SET lease_owner='replica-2', lease_until=? WHERE id=?",
            (time.time() + 60, created.id),
        )
    app.backends["alpha"].release.set()
    await until(lambda: "lease lost" in caplog.text)
    batch = await client.batches.retrieve(created.id)
    assert batch.status == "in_progress" and batch.request_counts is not None
    assert batch.request_counts.completed == 0  # line a's answer was not written
    assert len(app.backends["alpha"].calls) == 1  # and line b never started


async def test_admin_key_is_not_needed_and_reads_create_nothing(
    make: AppFactory, tmp_path: Path
) -> None:
    app = await make(make_config(**batch_config(tmp_path / "state")))
    reply = await app.http.get("/v1/files", headers={"authorization": f"Bearer {KEY_A}"})
    assert reply.status_code == 200 and reply.json()["data"] == []
    assert not (tmp_path / "state").exists()
    assert ADMIN


async def test_the_console_lists_every_keys_batches_with_progress(
    make: AppFactory, tmp_path: Path
) -> None:
    app = await make(make_config(**batch_config(tmp_path, max_concurrency=1)))
    admin = {"authorization": f"Bearer {ADMIN}"}
    assert (await app.http.get("/admin/batches", headers=admin)).json() == {"batches": []}
    assert not (tmp_path / "batches.sqlite3").exists()  # a look creates nothing
    lines = [chat_line("first", "hold"), *(chat_line(f"later-{i}") for i in range(3))]
    held = await submit(sdk(app), jsonl(*lines))
    await until(lambda: bool(app.backends["alpha"].calls))
    other = await submit(sdk(app, KEY_B), jsonl(chat_line("b-0")))

    # The first line is running; the second key's batch waits behind it (one at a time).
    listing = (await app.http.get("/admin/batches", headers=admin)).json()["batches"]
    assert [(row["id"], row["owner"]) for row in listing] == [
        (other.id, "team-b"),
        (held.id, "team-a"),
    ]
    running = listing[1]
    assert running["status"] == "in_progress"
    assert running["request_counts"] == {"total": 4, "completed": 0, "failed": 0, "started": 1}
    assert running["reruns"] == 0
    # A key's own listing stays its own.
    assert [b.id for b in (await sdk(app, KEY_B).batches.list()).data] == [other.id]

    app.backends["alpha"].release.set()
    await wait_for(sdk(app), held.id, "completed")
    await wait_for(sdk(app, KEY_B), other.id, "completed")
    listing = (await app.http.get("/admin/batches?limit=1", headers=admin)).json()["batches"]
    assert [row["id"] for row in listing] == [other.id]
    listing = (await app.http.get("/admin/batches", headers=admin)).json()["batches"]
    assert listing[1]["request_counts"] == {"total": 4, "completed": 4, "failed": 0, "started": 0}

    assert (await app.http.get("/admin/batches")).status_code == 401
    key_a = {"authorization": f"Bearer {KEY_A}"}
    assert (await app.http.get("/admin/batches", headers=key_a)).status_code == 401
    refused = await app.http.get("/admin/batches?limit=0", headers=admin)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"


async def test_lines_are_charged_at_the_batch_discount_and_a_spent_budget_fails_them(
    make: AppFactory, tmp_path: Path
) -> None:
    """Two lines at half price (7 prompt + 2 completion tokens: 0.0011 USD online, so
    0.00055 each), then a key whose budget the first line spends: its second line fails
    at once with 429 budget_exceeded, since the budget resets after the batch's window."""
    prices = {"input": 100.0, "output": 200.0, "batch_discount": 0.5}
    models = [{"name": "alpha", "backend": "openai", "base_url": "http://u", "pricing": prices}]
    config = batch_config(tmp_path, max_concurrency=1)
    config.update(keys(team("team-a", KEY_A), team("team-b", KEY_B, max_budget=0.0005)))
    app = await make(make_config(models=models, **config))
    done = await wait_for(sdk(app), (await submit(sdk(app), jsonl(*lines(2)))).id, "completed")
    assert done.request_counts is not None and done.request_counts.completed == 2
    usage = await app.http.get("/admin/usage", headers={"authorization": f"Bearer {ADMIN}"})
    spend = {entry["name"]: entry["spend"]["usd"] for entry in usage.json()["keys"]}
    assert spend["team-a"] == pytest.approx(0.0011)  # two lines at half of 0.0011
    online = await app.http.post(
        "/v1/chat/completions",
        json=chat_line("x")["body"],
        headers={"authorization": f"Bearer {KEY_A}"},
    )
    assert online.headers["x-llmso-cost"] == "0.0011"

    month_end = bounds(time.time(), "month")[1] * DAY
    if month_end - time.time() < 86400 + 60:
        pytest.skip("the budget resets within the batch's 24 h window today")
    spent = await submit(sdk(app, KEY_B), jsonl(*lines(2)))
    done = await wait_for(sdk(app, KEY_B), spent.id, "completed")
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    (failed,) = await read_lines(sdk(app, KEY_B), done.error_file_id)
    assert failed["response"]["status_code"] == 429
    assert failed["response"]["body"]["error"]["code"] == "budget_exceeded"


def lines(count: int) -> list[dict[str, Any]]:
    return [chat_line(f"line-{i}") for i in range(count)]
