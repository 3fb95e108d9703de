"""Every body and chunk we build validates against the official OpenAI schemas."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import BackendError, RequestKind, TokenLogprob, ToolCallDelta, TopLogprob, Usage
from gateway.errors import error_payload
from gateway.service.chat_bodies import SSE_DONE, ChoiceAccumulator, ChunkWriter, full_response, sse
from tests.tools.schemas import validate

LOGPROB = TokenLogprob("Hi", -0.5, (72, 105), (TopLogprob("Hi", -0.5, (72, 105)),))


def decode(frame: bytes) -> dict[str, object]:
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    payload: dict[str, object] = orjson.loads(frame[6:-2])
    return payload


@pytest.mark.parametrize("want_logprobs", [False, True])
def test_chat_response_matches_schema(want_logprobs: bool) -> None:
    choice = ChoiceAccumulator(["Hi", " there"], [LOGPROB], "length")
    body = full_response(
        RequestKind.CHAT,
        response_id="chatcmpl-1",
        created=1,
        model="m",
        choices=[choice],
        usage=Usage(3, 2, cached_tokens=2),
        want_logprobs=want_logprobs,
    )
    validate("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"]["content"] == "Hi there"
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 2},
    }


@pytest.mark.parametrize("want_logprobs", [False, True])
def test_completion_response_matches_schema(want_logprobs: bool) -> None:
    choice = ChoiceAccumulator(["abc"], [LOGPROB], "stop")
    body = full_response(
        RequestKind.COMPLETION,
        response_id="cmpl-1",
        created=1,
        model="m",
        choices=[choice],
        usage=Usage(1, 1),
        want_logprobs=want_logprobs,
    )
    validate("CreateCompletionResponse", body)
    assert body["object"] == "text_completion"


def test_chat_chunks_match_schema() -> None:
    writer = ChunkWriter(RequestKind.CHAT, "chatcmpl-1", 1, "m", True)
    frames = [writer.role(0), writer.text(0, "Hi", [LOGPROB]), writer.finish(0, "stop")]
    frames.append(writer.usage(Usage(3, 1)))
    for frame in frames:
        validate("CreateChatCompletionStreamResponse", decode(frame))
    assert decode(frames[0])["choices"][0]["delta"]["role"] == "assistant"  # type: ignore[index]
    assert decode(frames[-1])["choices"] == []
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_completion_chunks_match_schema() -> None:
    writer = ChunkWriter(RequestKind.COMPLETION, "cmpl-1", 1, "m", True)
    first = decode(writer.text(0, "ab", [LOGPROB]))
    second = decode(writer.text(0, "c", [LOGPROB]))
    for payload in (first, second, decode(writer.finish(0, "length"))):
        validate("CreateCompletionResponse", payload)
    # Offsets continue across chunks of one choice.
    assert second["choices"][0]["logprobs"]["text_offset"] == [2]  # type: ignore[index]


def test_error_payload_matches_schema() -> None:
    validate("ErrorResponse", error_payload(BackendError("boom", param="x")))


def _tool_choice() -> ChoiceAccumulator:
    choice = ChoiceAccumulator(finish_reason="tool_calls")
    choice.add_tool_delta(ToolCallDelta(0, 0, "call_a", "get_weather", '{"city": '))
    choice.add_tool_delta(ToolCallDelta(0, 0, arguments_fragment='"Oslo"}'))
    choice.add_tool_delta(ToolCallDelta(0, 1, "call_b", "noop", "{}"))
    return choice


def test_tool_call_response_matches_schema() -> None:
    body = full_response(
        RequestKind.CHAT,
        response_id="chatcmpl-1",
        created=1,
        model="m",
        choices=[_tool_choice()],
        usage=Usage(3, 2),
        want_logprobs=False,
    )
    validate("CreateChatCompletionResponse", body)
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {
            "id": "call_a",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
    ]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_call_chunks_are_shaped_as_openai_sends_them() -> None:
    writer = ChunkWriter(RequestKind.CHAT, "chatcmpl-1", 1, "m", False)
    first = decode(writer.tool_call(ToolCallDelta(0, 0, "call_a", "get_weather", "")))
    later = decode(writer.tool_call(ToolCallDelta(0, 0, arguments_fragment='{"city"')))
    last = decode(writer.finish(0, "tool_calls"))
    for payload in (first, later, last):
        validate("CreateChatCompletionStreamResponse", payload)
    assert first["choices"][0]["delta"] == {  # type: ignore[index]
        "tool_calls": [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert later["choices"][0]["delta"] == {  # type: ignore[index]
        "tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]
    }


@settings(max_examples=200, deadline=None)
@given(text=st.text(), index=st.integers(min_value=0, max_value=3))
def test_a_plain_text_frame_is_the_chunk_in_full(text: str, index: int) -> None:
    """The chat text frame without logprobs, built from bytes made once, is byte for byte
    the chunk object encoded (and valid against the schema)."""
    writer = ChunkWriter(RequestKind.CHAT, "chatcmpl-1", 7, "m/ü", False)
    frame = writer.text(index, text, ())
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7, "model": "m/ü"}
    choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
    assert frame == sse({**head, "choices": [choice]})
    assert writer.text(index, text, ()) == frame  # its head, kept, is the same
    validate("CreateChatCompletionStreamResponse", decode(frame))
