"""Tool-calling and structured-output checks shared by the engine e2e modules (hf, vLLM):
each drives the official SDK against a gateway and asserts shapes, never wording."""

from __future__ import annotations

import json
from typing import Any

import openai
from pydantic import BaseModel, Field


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
ASK: Any = [{"role": "user", "content": "What is the weather in Oslo?"}]


def parse_city(client: openai.OpenAI, model: str, max_tokens: int) -> City:
    """``chat.completions.parse`` with a Pydantic model: the answer must parse."""
    completion = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Name a big city and its population."}],
        response_format=City,
        max_tokens=max_tokens,
        temperature=0,
    )
    assert completion.choices[0].finish_reason == "stop"
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City)
    return parsed


def stream_forced_call(client: openai.OpenAI, model: str, max_tokens: int) -> Any:
    """The SDK's ``stream`` helper with ``tool_choice: required``: one call to
    ``get_weather`` rebuilt from the deltas, reported done once; returns the message."""
    with client.chat.completions.stream(
        model=model,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=max_tokens,
        temperature=0,
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    [call] = choice.message.tool_calls or []
    assert call.id and call.function.name == "get_weather"
    assert isinstance(call.function.arguments, str)
    assert [e.name for e in done] == ["get_weather"]
    return choice.message


def round_trip(client: openai.OpenAI, model: str, message: Any) -> None:
    """The call and its ``tool`` result go back; the model answers in text."""
    [call] = message.tool_calls
    answer = client.chat.completions.create(
        model=model,
        messages=[
            *ASK,
            message.model_dump(exclude_none=True, exclude={"parsed"}),
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny"})},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
