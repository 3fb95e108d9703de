"""Wire → backend translation: every honoured field lands, every unsupported one is named."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from backends.base import InvalidRequest, RequestKind
from gateway.errors import from_validation_error
from gateway.protocol import ChatCompletionRequest, CompletionRequest
from gateway.translate import (
    UNSET_MAX_TOKENS,
    chat_request,
    completion_prompts,
    completion_request,
)


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
    assert request.user == "u1" and request.max_tokens_explicit


def test_chat_defaults() -> None:
    request = chat_request(chat(), "rid", 1.0)
    assert request.sampling.max_tokens == UNSET_MAX_TOKENS
    assert not request.max_tokens_explicit
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
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logit_bias": {"1": 2.0}}, "logit_bias"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
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
        ({"echo": True, "logprobs": 1}, "echo"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            completion_request(wire(**fields), "rid", 1.0)
        assert caught.value.param == param, fields


def test_unknown_fields_are_kept_aside() -> None:
    wire = chat(some_future_field=1)
    assert wire.unknown_fields() == ["some_future_field"]
