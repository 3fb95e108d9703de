"""Constrained decoding in the hf engine with the real SmolLM2 and xgrammar.

Shapes only, never wording: JSON that parses and validates, calls of the right tool
whose arguments match its schema, finish reasons. One backend for the module (with
``close_json_by_budget`` on, the default: every value is whole whatever ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest

from backends.base import (
    Feature,
    Finished,
    GenerationRequest,
    InvalidRequest,
    ResponseFormat,
    ToolChoice,
    ToolSpec,
)
from backends.hf.backend import HFBackend
from tests.hf.helpers import Result, chat, collect, config

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"],
    },
)
FLAG = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}
CLOCK = ToolSpec("get_time", "Current time", {"type": "object", "properties": {}})


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[HFBackend]:
    b = HFBackend(config(scheduling="continuous", max_num_seqs=32))
    await b.start()
    yield b
    await b.stop()


def with_schema(request: GenerationRequest, schema: dict[str, Any]) -> GenerationRequest:
    fmt = ResponseFormat("json_schema", name="s", schema=schema)
    return dataclasses.replace(request, response_format=fmt)


def with_tools(request: GenerationRequest, choice: ToolChoice) -> GenerationRequest:
    return dataclasses.replace(request, tools=(WEATHER, CLOCK), tool_choice=choice)


async def run(backend: HFBackend, request: GenerationRequest) -> Result:
    return await collect(backend.generate(request))


def closed_by_budget(result: Result, index: int = 0) -> bool:
    [finished] = [e for e in result.events if isinstance(e, Finished) and e.index == index]
    return finished.closed_by_budget


async def test_json_object_is_an_object(backend: HFBackend) -> None:
    for tokens in (2, 8, 48):
        request = dataclasses.replace(
            chat("Reply with JSON.", tokens, temperature=0.7, seed=tokens),
            response_format=ResponseFormat("json_object"),
        )
        result = await run(backend, request)
        assert result.reason() == "stop"
        assert isinstance(json.loads(result.text()), dict)


async def test_json_object_with_a_schema_is_held_to_it(backend: HFBackend) -> None:
    """llama.cpp's convention, sent by instructor's JSON_SCHEMA mode."""
    fmt = ResponseFormat("json_object", schema=PERSON)
    for seed in (1, 2):
        request = chat("Tell me about the weather.", 40, temperature=0.7, seed=seed)
        result = await run(backend, dataclasses.replace(request, response_format=fmt))
        assert result.reason() == "stop"
        jsonschema.validate(json.loads(result.text()), PERSON)


async def test_max_tokens_below_the_shortest_value_is_a_400(backend: HFBackend) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await run(backend, with_schema(chat("Describe a person.", 3), PERSON))
    assert caught.value.param == "max_tokens"
    least = int(caught.value.message.split("at least ")[1])
    # At exactly the minimum the value is whole: closed by budget, finish "stop".
    request = with_schema(chat("Describe a person.", least, temperature=0.7, seed=1), PERSON)
    result = await run(backend, request)
    assert result.reason() == "stop" and closed_by_budget(result)
    assert result.usage.completion_tokens <= least
    jsonschema.validate(json.loads(result.text()), PERSON)
    assert Feature.CLOSES_BY_BUDGET in backend.info().features


async def test_required_tool_call_matches_the_tool_schema(backend: HFBackend) -> None:
    request = with_tools(chat("What is the weather in Oslo?", 48), ToolChoice("required"))
    result = await run(backend, request)
    assert result.reason() == "tool_calls"
    assert result.text() == ""  # no markup leaks into content
    [(name, arguments)] = result.calls()
    tools = {"get_weather": WEATHER, "get_time": CLOCK}
    jsonschema.validate(json.loads(arguments), tools[name].parameters)


async def test_n_forks_the_matcher(backend: HFBackend) -> None:
    flag = ToolSpec("set_flag", None, FLAG)
    request = dataclasses.replace(
        chat("Set the flag.", 40, n=2, temperature=0.9, seed=7),
        tools=(WEATHER, flag),
        tool_choice=ToolChoice("named", "set_flag"),
    )
    result = await run(backend, request)
    for index in (0, 1):
        assert result.reason(index) == "tool_calls"
        [(name, arguments)] = result.calls(index)
        assert name == "set_flag"
        jsonschema.validate(json.loads(arguments), FLAG)


async def test_uncompilable_schema_is_a_400_with_the_reason(backend: HFBackend) -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    with pytest.raises(InvalidRequest) as caught:
        await run(backend, with_schema(chat("x", 4), schema))
    assert caught.value.param == "response_format.json_schema.schema"
    assert "compile" in caught.value.message
    bad_tool = dataclasses.replace(WEATHER, parameters=schema)
    request = dataclasses.replace(
        chat("x", 4), tools=(bad_tool,), tool_choice=ToolChoice("required")
    )
    with pytest.raises(InvalidRequest) as caught:
        await run(backend, request)
    assert caught.value.param == "tools"


def _schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A random small object schema: bounded strings, integers, enums, booleans, arrays."""
    properties: dict[str, Any] = {}
    for index in range(rng.randint(1, 3)):
        kind = rng.choice(["string", "integer", "boolean", "enum", "array", "object"])
        if kind == "object" and depth == 0:
            value = _schema(rng, depth + 1)
        elif kind == "array":
            value = {"type": "array", "items": {"type": "integer", "maximum": 99}, "maxItems": 2}
        elif kind == "enum":
            value = {"enum": rng.sample(["red", "green", "blue", 1, True, None], 3)}
        elif kind == "string":
            value = {"type": "string", "maxLength": rng.randint(1, 6)}
        elif kind == "integer":
            value = {"type": "integer", "minimum": -50, "maximum": 50}
        else:
            value = {"type": "boolean"}
        properties[f"{kind}_{index}"] = value
    required = rng.sample(sorted(properties), rng.randint(0, len(properties)))
    return {"type": "object", "properties": properties, "required": required}


def _wandering_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """All fields required, unbounded strings, nested objects and arrays of objects:
    what a small model at temperature 0.7 wanders in until max_tokens cuts it."""
    properties: dict[str, Any] = {}
    for index in range(rng.randint(1, 4)):
        kind = rng.choice(["string", "string", "integer", "number", "enum", "array", "object"])
        if kind == "object" and depth < 2:
            value = _wandering_schema(rng, depth + 1)
        elif kind == "array":
            items = _wandering_schema(rng, depth + 1) if depth < 2 else {"type": "string"}
            value = {"type": "array", "items": items, "minItems": rng.randint(0, 2)}
        elif kind == "enum":
            value = {"enum": ["red", "green", "blue"]}
        elif kind == "integer":
            value = {"type": "integer", "minimum": 3}
        elif kind == "number":
            value = {"type": "number"}
        else:
            value = {"type": "string"}
        properties[f"{kind}_{index}"] = value
    return {"type": "object", "properties": properties, "required": sorted(properties)}


async def test_generated_schemas_always_validate(backend: HFBackend) -> None:
    rng = random.Random(20261201)
    prompts = ["Fill in the form.", "Write a long story as JSON.", "Describe a cat.", "Data:"]
    cases = []
    for i in range(24):
        schema = _schema(rng) if i % 3 == 0 else _wandering_schema(rng)
        tokens = rng.randint(24, 64) if i % 6 else rng.randint(65, 200)
        request = with_schema(chat(prompts[i % 4], tokens, temperature=0.7, seed=i), schema)
        cases.append((schema, request))
    results = await asyncio.gather(
        *(run(backend, request) for _, request in cases), return_exceptions=True
    )
    closed = 0
    for (schema, request), result in zip(cases, results, strict=True):
        if isinstance(result, InvalidRequest):  # a budget below this schema's minimum
            assert result.param == "max_tokens"
            continue
        assert isinstance(result, Result), result
        assert result.reason() == "stop", (request.sampling.max_tokens, result.text())
        assert result.usage.completion_tokens <= request.sampling.max_tokens
        jsonschema.validate(json.loads(result.text()), schema)
        closed += closed_by_budget(result)
    assert closed >= 3, "the budget never had to close a value: the test lost its point"


async def test_forced_tool_calls_close_within_tight_budgets(backend: HFBackend) -> None:
    story = ToolSpec(
        "write_story",
        "Write a story",
        {
            "type": "object",
            "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
            "required": ["title", "text"],
        },
    )
    requests = [
        dataclasses.replace(
            chat("Write a long story about a dragon.", tokens, temperature=0.7, seed=tokens),
            tools=(story, WEATHER),
            tool_choice=choice,
        )
        for tokens in (40, 48, 56)
        for choice in (ToolChoice("required"), ToolChoice("named", "write_story"))
    ]
    results = await asyncio.gather(*(run(backend, r) for r in requests))
    tools = {"write_story": story, "get_weather": WEATHER}
    for request, result in zip(requests, results, strict=True):
        assert result.reason() == "tool_calls", result.text()
        assert result.text() == ""
        for name, arguments in result.calls():
            jsonschema.validate(json.loads(arguments), tools[name].parameters)
        assert result.usage.completion_tokens <= request.sampling.max_tokens
    assert any(closed_by_budget(result) for result in results)


async def test_switched_off_leaves_the_cut_value() -> None:
    """``close_json_by_budget: false``: the old contract (a prefix, ``length``)."""
    off = HFBackend(config(close_json_by_budget=False))
    await off.start()
    try:
        result = await run(off, with_schema(chat("Describe a person.", 3), PERSON))
        assert Feature.CLOSES_BY_BUDGET not in off.info().features
    finally:
        await off.stop()
    assert result.reason() == "length" and not closed_by_budget(result)
    assert result.text().startswith("{")


async def test_constrained_batched_with_free_matches_alone(backend: HFBackend) -> None:
    constrained = [  # budgets tight enough for some to close by budget
        with_schema(chat("Describe a person.", 16), PERSON),
        with_tools(chat("Weather in Oslo?", 28), ToolChoice("required")),
        with_tools(chat("Weather in Oslo?", 16), ToolChoice("auto")),
    ]
    free = [chat("Tell me a story.", 16), chat("What is 2+2?", 16)]
    alone = [await run(backend, request) for request in constrained]
    together = await asyncio.gather(*(run(backend, r) for r in [*constrained, *free]))
    for single, batched in zip(alone, together, strict=False):
        assert batched.text() == single.text() and batched.calls() == single.calls()
    assert "<tool_call" not in alone[2].text()  # auto: markup never reaches the content
