"""Wire → backend translation: every honoured field lands, every unsupported one is named."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from backends.base import InvalidRequest, RequestKind, ResponseFormat, ToolCall, ToolChoice
from gateway.api.translate import (
    chat_request,
    completion_prompts,
    completion_request,
)
from gateway.api.wire import ChatCompletionRequest, CompletionRequest
from gateway.errors import from_validation_error

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}
BAD = {"type": "object", "properties": {"city": {"type": "strin"}}}


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_chat_fields_reach_sampling_params() -> None:
    request = chat_request(
        chat(
            max_completion_tokens=7,
            max_tokens=99,
            temperature=0,
            top_p=0.5,
            stop="END",
            seed=3,
            n=2,
            logprobs=True,
            top_logprobs=4,
            presence_penalty=0.5,
            user="u1",
        ),
        "rid",
        1.0,
    )
    sampling = request.sampling
    assert request.kind is RequestKind.CHAT
    assert sampling.max_tokens == 7  # max_completion_tokens wins over max_tokens
    assert (sampling.temperature, sampling.top_p, sampling.seed, sampling.n) == (0, 0.5, 3, 2)
    assert sampling.stop == ("END",)
    assert sampling.logprobs == 4
    assert sampling.presence_penalty == 0.5
    assert request.user == "u1"


def test_chat_defaults() -> None:
    request = chat_request(chat(), "rid", 1.0)
    assert request.sampling.max_tokens is None  # unset: each backend's effective limit
    assert request.sampling.temperature == 1.0
    assert request.sampling.logprobs is None


def test_content_parts_are_joined() -> None:
    wire = chat(
        messages=[
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ]
    )
    request = chat_request(wire, "rid", 1.0)
    assert [m.content for m in request.messages] == ["be brief", "a\nb"]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"logit_bias": {"a": 2.0}}, "logit_bias"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": BAD},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c",
                                "type": "function",
                                "function": {"name": "f", "arguments": {"a": 1}},
                            }
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"messages": [{"role": "function", "name": "f", "content": "1"}]}, "messages[0]"),
    ],
)
def test_unsupported_chat_fields_name_their_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        chat_request(chat(**fields), "rid", 1.0)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3},
            "temperature",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a"] * 5}, "stop"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_validation_errors_map_to_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    error = from_validation_error(caught.value)
    assert error.status == 400
    assert error.param == param, error.message


def test_completion_prompt_forms() -> None:
    one = CompletionRequest.model_validate({"model": "m", "prompt": ["only"], "max_tokens": 3})
    request = completion_request(one, "rid", 1.0)
    assert request.prompt == "only" and request.kind is RequestKind.COMPLETION
    assert completion_prompts(["a", "b"]) == ("a", "b")
    assert completion_prompts([1, 2, 3]) == ((1, 2, 3),)
    assert completion_prompts([[1, 2], [3]]) == ((1, 2), (3,))
    ids = completion_request(
        CompletionRequest.model_validate({"model": "m", "prompt": [5, 6]}), "r", 1.0
    )
    assert ids.prompt == "" and ids.prompt_token_ids == (5, 6)
    for prompt, param in (([], "prompt"), ([[1], []], "prompt[1]"), ([[-1]], "prompt[0]")):
        with pytest.raises(InvalidRequest) as caught:
            completion_prompts(prompt)
        assert caught.value.param == param


def test_completion_best_of_echo_and_suffix() -> None:
    def wire(**fields: object) -> CompletionRequest:
        return CompletionRequest.model_validate({"model": "m", "prompt": "p", **fields})

    ranked = completion_request(wire(n=2, best_of=3), "rid", 1.0)
    assert ranked.sampling.n == 3 and ranked.sampling.logprobs == 0  # ranking needs logprobs
    plain = completion_request(wire(n=2, best_of=2), "rid", 1.0)
    assert plain.sampling.n == 2 and plain.sampling.logprobs is None
    assert completion_request(wire(suffix="tail"), "rid", 1.0).suffix == "tail"
    for fields, param in (
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"n": 1, "best_of": 2, "stream": True}, "best_of"),
        ({"best_of": 129}, "best_of"),
        ({"max_tokens": 0}, "max_tokens"),  # nothing generated and nothing scored
        ({"max_tokens": 0, "echo": True}, "max_tokens"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            completion_request(wire(**fields), "rid", 1.0)
        assert caught.value.param == param, fields


def test_echo_with_logprobs_and_prompt_logprobs_score_the_prompt() -> None:
    def scoring(**fields: object) -> int | None:
        wire = CompletionRequest.model_validate({"model": "m", "prompt": "p", **fields})
        return completion_request(wire, "rid", 1.0).prompt_logprobs

    assert scoring() is None
    assert scoring(echo=True) is None
    assert scoring(logprobs=2) is None
    assert scoring(echo=True, logprobs=1, max_tokens=0) == 1
    assert scoring(prompt_logprobs=0) == 0
    assert scoring(prompt_logprobs=4, echo=True, logprobs=2) == 4


def test_unknown_fields_are_kept_aside() -> None:
    wire = chat(some_future_field=1)
    assert wire.unknown_fields() == ["some_future_field"]


def test_tools_and_tool_turns_reach_the_request() -> None:
    request = chat_request(
        chat(
            tools=[TOOL],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            messages=[
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
        ),
        "rid",
        1.0,
    )
    [tool] = request.tools
    assert (tool.name, tool.strict) == ("get_weather", True)
    assert tool.parameters["properties"] == {"city": {"type": "string"}}  # type: ignore[index]
    assert request.tool_choice == ToolChoice("named", "get_weather")
    assert request.parallel_tool_calls is False
    assistant, answer = request.messages[1:]
    assert assistant.content == "" and assistant.tool_calls == (
        ToolCall("call_1", "get_weather", '{"city":"Oslo"}'),
    )
    assert (answer.role, answer.tool_call_id, answer.content) == ("tool", "call_1", "sunny")


def test_legacy_functions_map_onto_tools() -> None:
    request = chat_request(
        chat(
            functions=[TOOL["function"]],
            function_call={"name": "get_weather"},
            messages=[
                {"role": "user", "content": "weather?"},
                {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": "get_weather", "arguments": "{}"},
                },
                {"role": "function", "name": "get_weather", "content": "sunny"},
            ],
        ),
        "rid",
        1.0,
    )
    assert [t.name for t in request.tools] == ["get_weather"]
    assert request.tool_choice == ToolChoice("named", "get_weather")
    call = request.messages[1].tool_calls[0]
    assert request.messages[2].role == "tool" and request.messages[2].tool_call_id == call.id


def test_response_formats() -> None:
    assert chat_request(chat(), "r", 1.0).response_format == ResponseFormat()
    as_object = chat_request(chat(response_format={"type": "json_object"}), "r", 1.0)
    assert as_object.response_format.type == "json_object"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    wire = chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "A", "schema": schema, "strict": True},
        }
    )
    fmt = chat_request(wire, "r", 1.0).response_format
    assert (fmt.type, fmt.name, fmt.strict) == ("json_schema", "A", True)
    # llama.cpp's convention (instructor's JSON_SCHEMA mode): json_object with a schema.
    wire = chat(response_format={"type": "json_object", "schema": schema})
    fmt = chat_request(wire, "r", 1.0).response_format
    assert fmt.type == "json_object" and fmt.schema == schema
    with pytest.raises(InvalidRequest) as caught:
        chat_request(chat(response_format={"type": "json_object", "schema": {"type": 3}}), "r", 1.0)
    assert caught.value.param == "response_format.schema"


def test_image_parts_and_unknown_fields_are_kept_for_passthrough() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    wire = chat(
        messages=[{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}],
        logit_bias={"42": -100},
        vendor_knob={"x": 1},
    )
    request = chat_request(wire, "r", 1.0)
    message = request.messages[0]
    assert message.content == "what?"
    assert [json.loads(part.json) for part in message.parts] == [
        {"type": "text", "text": "what?"},
        image,
    ]
    assert request.logit_bias == (("42", -100.0),)
    assert json.loads(request.passthrough) == {"vendor_knob": {"x": 1}}
