"""The first minute, as a new user has it: `llmso serve` on `config/default.yaml` as it
ships (bf16 chat model and the embedding model, both preloaded), `/ready`, then the
first requests the README and docs show, as the very first ones: the README's curl chat and
SDK stream, docs/embeddings.md's embeddings and docs/responses.md's `/v1/responses`.
Three fresh starts in a row; the log of each must show no crash, no import error and no
restart.

Before the load lock (backends/process_wide.py) most such starts crashed the chat
model's first request, or never loaded it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.tools.servers import REPO, RunningServer, free_port, start_process, stop_process

pytestmark = pytest.mark.e2e

SHIPPED = REPO / "config" / "default.yaml"
VENV_LLMSO = REPO / ".venv" / "bin" / "llmso"
# What must never appear in the log of a healthy start.
TROUBLE = re.compile(r"crashed|ImportError|restarting|Traceback|failed \(", re.IGNORECASE)


@pytest.fixture
def fresh_start() -> Iterator[RunningServer]:
    port = free_port()
    server = start_process(
        [str(VENV_LLMSO), "serve", "--config", str(SHIPPED), "--port", str(port)],
        port=port,
        health_path="/ready",
        timeout=240.0,
        env={"LLMSO_WATCH_CONFIG": "false"},
    )
    try:
        yield server
    finally:
        stop_process(server)


def _readme_requests(server: RunningServer) -> None:
    # The README's curl, byte for byte in meaning.
    reply = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 32,
        },
        timeout=120.0,
    )
    assert reply.status_code == 200, reply.text
    assert "Paris" in reply.json()["choices"][0]["message"]["content"]

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Write a haiku about GPUs."}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=48,
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text.strip() and usage is not None and usage.completion_tokens > 0

    vectors = client.embeddings.create(model="minilm", input=["first text", "second text"])
    assert [len(item.embedding) for item in vectors.data] == [384, 384]

    first = client.responses.create(
        model="smollm2", input="My name is Alice.", max_output_tokens=32
    )
    second = client.responses.create(
        model="smollm2",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=32,
    )
    assert first.output_text.strip() and second.output_text.strip()


@pytest.mark.parametrize("attempt", [1, 2, 3])
def test_shipped_config_answers_the_readme_first(fresh_start: RunningServer, attempt: int) -> None:
    assert (
        subprocess.run(
            ["git", "diff", "--quiet", "--", str(SHIPPED)], cwd=REPO, check=False
        ).returncode
        == 0
    )
    _readme_requests(fresh_start)
    log = fresh_start.log_path.read_text(errors="replace")
    trouble = [line for line in log.splitlines() if TROUBLE.search(line)]
    assert trouble == [], f"start {attempt}:\n" + "\n".join(trouble)
