"""Constrained decoding in the hf engine with the real SmolLM2 and xgrammar.

Shapes only, never wording: JSON that parses and validates, calls of the right tool
whose arguments match its schema, finish reasons. One backend for the module.
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


async def test_json_object_is_an_object(backend: HFBackend) -> None:
    request = dataclasses.replace(
        chat("Reply with JSON.", 48), response_format=ResponseFormat("json_object")
    )
    result = await run(backend, request)
    if result.reason() == "stop":
        assert isinstance(json.loads(result.text()), dict)
    else:  # cut by max_tokens: still a valid JSON prefix of an object
        assert result.reason() == "length" and result.text().startswith("{")


async def test_max_tokens_cut_ends_with_length(backend: HFBackend) -> None:
    result = await run(backend, with_schema(chat("Describe a person.", 3), PERSON))
    assert result.reason() == "length"
    assert result.text().startswith("{")


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


async def test_generated_schemas_always_validate(backend: HFBackend) -> None:
    rng = random.Random(20261201)
    schemas = [_schema(rng) for _ in range(50)]
    prompts = ["Fill in the form.", "JSON please.", "Describe a cat.", "Data:"]
    results = await asyncio.gather(
        *(
            run(backend, with_schema(chat(prompts[i % 4], 40), schema))
            for i, schema in enumerate(schemas)
        )
    )
    finished = 0
    for schema, result in zip(schemas, results, strict=True):
        if result.reason() == "stop":
            finished += 1
            jsonschema.validate(json.loads(result.text()), schema)
        else:  # cut by max_tokens: a prefix of a valid object, never anything else
            assert result.reason() == "length" and result.text().startswith("{")
    # Most fit in 40 tokens (41/50 measured); the bound keeps the test meaningful.
    assert finished >= 35, f"only {finished} of 50 finished within 40 tokens"


async def test_constrained_batched_with_free_matches_alone(backend: HFBackend) -> None:
    constrained = [
        with_schema(chat("Describe a person.", 16), PERSON),
        with_tools(chat("Weather in Oslo?", 16), ToolChoice("required")),
        with_tools(chat("Weather in Oslo?", 16), ToolChoice("auto")),
    ]
    free = [chat("Tell me a story.", 16), chat("What is 2+2?", 16)]
    alone = [await run(backend, request) for request in constrained]
    together = await asyncio.gather(*(run(backend, r) for r in [*constrained, *free]))
    for single, batched in zip(alone, together, strict=False):
        assert batched.text() == single.text() and batched.calls() == single.calls()
    assert "<tool_call" not in alone[2].text()  # auto: markup never reaches the content
