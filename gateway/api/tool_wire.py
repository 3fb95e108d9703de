"""Tools, tool choice, response format and tool turns: wire → backend types.

One place validates them, so every backend sees the same checked values: a schema that
is not a valid JSON Schema (checked against its meta-schema), a ``tool_choice`` naming an
unknown function, a tool message without ``tool_call_id`` or a tool call whose
``arguments`` is not a string is a 400 naming the ``param``. Legacy ``functions`` /
``function_call`` map onto tools; legacy ``function`` messages onto ``tool`` messages.
"""

from __future__ import annotations

import re
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from backends.base import (
    InvalidRequest,
    JsonSchema,
    ResponseFormat,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from gateway.api.wire import ChatCompletionRequest, WireMessage

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The id a legacy function_call turn gets, so the following function message can name it.
LEGACY_CALL_ID = "call_legacy_{index}"


def checked_schema(schema: Any, param: str) -> JsonSchema:
    """``schema`` (parsed JSON) once it passes its JSON Schema meta-schema."""
    if not isinstance(schema, dict | bool):
        raise InvalidRequest("must be a JSON Schema object", param=param)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        raise InvalidRequest(
            f"invalid JSON Schema{f' at {where}' if where else ''}: {exc.message}", param=param
        ) from None
    return schema


def tools(wire: ChatCompletionRequest) -> tuple[ToolSpec, ...]:
    if wire.tools and wire.functions:
        raise InvalidRequest("send either tools or the legacy functions", param="functions")
    if wire.tools:
        return tuple(_tool(index, entry) for index, entry in enumerate(wire.tools))
    if wire.functions:
        return tuple(
            _function(f"functions[{index}]", entry) for index, entry in enumerate(wire.functions)
        )
    return ()


def _tool(index: int, entry: dict[str, Any]) -> ToolSpec:
    where = f"tools[{index}]"
    if entry.get("type") != "function":
        raise InvalidRequest("only tools of type 'function' are supported", param=f"{where}.type")
    function = entry.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest("a function tool needs a 'function' object", param=where)
    return _function(f"{where}.function", function)


def _function(where: str, function: dict[str, Any]) -> ToolSpec:
    return function_spec(where, function, "parameters")


def function_spec(where: str, function: dict[str, Any], schema_key: str) -> ToolSpec:
    """A function tool's spec from its wire object, its JSON Schema under
    ``schema_key`` (chat's ``parameters``, Anthropic's ``input_schema``)."""
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(
            "function name must be 1-64 letters, digits, '_' or '-'", param=f"{where}.name"
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest("description must be a string", param=f"{where}.description")
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest("strict must be a boolean", param=f"{where}.strict")
    parameters = function.get(schema_key)
    if parameters is None:
        return ToolSpec(name=name, description=description, strict=strict)
    schema = checked_schema(parameters, f"{where}.{schema_key}")
    return ToolSpec(name=name, description=description, parameters=schema, strict=strict)


def tool_choice(wire: ChatCompletionRequest, specs: tuple[ToolSpec, ...]) -> ToolChoice | None:
    if wire.tool_choice is not None and wire.function_call is not None:
        raise InvalidRequest("send either tool_choice or function_call", param="function_call")
    raw, param = (
        (wire.tool_choice, "tool_choice")
        if wire.function_call is None
        else (wire.function_call, "function_call")
    )
    if raw is None:
        return None
    choice = _choice(raw, param)
    if choice.mode != "none" and not specs:
        raise InvalidRequest(f"{param} is only allowed when tools are specified", param=param)
    if choice.mode == "named" and choice.name not in {spec.name for spec in specs}:
        raise InvalidRequest(f"{param} names an unknown function {choice.name!r}", param=param)
    return choice


def _choice(raw: Any, param: str) -> ToolChoice:
    if raw in ("none", "auto", "required"):
        return ToolChoice(raw)
    if isinstance(raw, dict):
        # tool_choice: {"type": "function", "function": {"name"}}; function_call: {"name"}
        target = raw.get("function") if param == "tool_choice" else raw
        if param == "tool_choice" and raw.get("type") != "function":
            raise InvalidRequest("tool_choice object must have type 'function'", param=param)
        if isinstance(target, dict) and isinstance(target.get("name"), str):
            return ToolChoice("named", target["name"])
    raise InvalidRequest(
        f"{param} must be 'none', 'auto', 'required' or name a function", param=param
    )


def response_format(wire: ChatCompletionRequest) -> ResponseFormat:
    raw = wire.response_format
    if raw is None:
        return ResponseFormat()
    kind = raw.get("type")
    if kind == "text":
        return ResponseFormat()
    if kind == "json_object":
        # A schema here is llama.cpp's (and instructor's JSON_SCHEMA mode's) convention.
        schema = raw.get("schema")
        if schema is None:
            return ResponseFormat("json_object")
        return ResponseFormat(
            "json_object", schema=checked_schema(schema, "response_format.schema")
        )
    if kind != "json_schema":
        raise InvalidRequest(
            "response_format type must be 'text', 'json_object' or 'json_schema'",
            param="response_format.type",
        )
    spec = raw.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidRequest("json_schema must be an object", param="response_format.json_schema")
    name = spec.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(
            "json_schema.name must be 1-64 letters, digits, '_' or '-'",
            param="response_format.json_schema.name",
        )
    schema = spec.get("schema", {"type": "object"})
    strict = spec.get("strict")
    description = spec.get("description")
    return ResponseFormat(
        "json_schema",
        name=name,
        schema=checked_schema(schema, "response_format.json_schema.schema"),
        strict=strict if isinstance(strict, bool) else None,
        description=description if isinstance(description, str) else None,
    )


def assistant_calls(index: int, message: WireMessage) -> tuple[ToolCall, ...]:
    """The calls of an assistant turn: ``tool_calls``, or one legacy ``function_call``."""
    where = f"messages[{index}]"
    if message.function_call is not None:
        return (
            _call(
                f"{where}.function_call", LEGACY_CALL_ID.format(index=index), message.function_call
            ),
        )
    calls: list[ToolCall] = []
    for position, entry in enumerate(message.tool_calls or ()):
        at = f"{where}.tool_calls[{position}]"
        if not isinstance(entry, dict) or entry.get("type", "function") != "function":
            raise InvalidRequest("a tool call must be an object of type 'function'", param=at)
        call_id = entry.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise InvalidRequest("a tool call needs a string id", param=f"{at}.id")
        calls.append(_call(f"{at}.function", call_id, entry.get("function")))
    return tuple(calls)


def _call(where: str, call_id: str, function: Any) -> ToolCall:
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequest("a tool call needs a function name", param=f"{where}.name")
    if "arguments" not in function:
        # As OpenAI answers; taking "{}" instead let a turn the client never sent steer
        # the generation.
        raise InvalidRequest(
            f"Missing required parameter: '{where}.arguments'.",
            param=f"{where}.arguments",
            code="missing_required_parameter",
        )
    arguments = function["arguments"]
    if not isinstance(arguments, str):
        raise InvalidRequest(
            "arguments must be a JSON string, not a JSON value", param=f"{where}.arguments"
        )
    return ToolCall(id=call_id, name=function["name"], arguments=arguments)


def legacy_function_call_id(messages: list[WireMessage], index: int) -> str:
    """The id of the latest legacy ``function_call`` turn before ``messages[index]``."""
    for earlier in range(index - 1, -1, -1):
        if messages[earlier].function_call is not None:
            return LEGACY_CALL_ID.format(index=earlier)
    raise InvalidRequest(
        "a function message must follow an assistant function_call", param=f"messages[{index}]"
    )
