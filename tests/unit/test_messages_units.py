"""The Messages API's pure parts: the error envelope per status, the param map from chat
notation back to this API's fields, and the assembler's blocks and stop reasons."""

from __future__ import annotations

import orjson
import pytest

from backends.base import Finished, TextDelta, ToolCallDelta, Usage
from backends.errors import ApiError, InvalidRequest, NotReady, Overloaded, UpstreamTimeout
from gateway.access.errors import RateLimited
from gateway.api.messages.render import MessageAssembler
from gateway.api.messages.translate import messages_request
from gateway.api.messages.wire import MessagesRequest
from gateway.api.thought_seal import ThoughtSeal
from gateway.errors import (
    HostNotAllowed,
    RequestTooLarge,
    Unauthorized,
    anthropic_payload,
    error_body,
)


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidRequest("bad", param="max_tokens"), "invalid_request_error"),
        (Unauthorized("no key"), "authentication_error"),
        (HostNotAllowed("host"), "permission_error"),
        (ApiError("gone", status=404), "not_found_error"),
        (RequestTooLarge("big"), "request_too_large"),
        (RateLimited("slow down", retry_after=1.0), "rate_limit_error"),
        (Overloaded("queue full"), "overloaded_error"),
        (NotReady("loading"), "overloaded_error"),
        (UpstreamTimeout("slow upstream"), "api_error"),
        (ApiError("boom"), "api_error"),
    ],
)
def test_envelope_type_follows_the_status(error: ApiError, kind: str) -> None:
    payload = anthropic_payload(error)
    assert payload == {
        "type": "error",
        "error": {"type": kind, "message": payload["error"]["message"]},
    }


def test_envelope_message_names_the_param_once() -> None:
    named = anthropic_payload(InvalidRequest("must be positive", param="max_tokens"))
    assert named["error"]["message"] == "max_tokens: must be positive"
    already = anthropic_payload(InvalidRequest("max_tokens: Field required", param="max_tokens"))
    assert already["error"]["message"] == "max_tokens: Field required"


def test_the_path_chooses_the_envelope() -> None:
    error = RateLimited("slow down", retry_after=2.5)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body, headers = error_body(error, path)
        assert orjson.loads(body)["type"] == "error" and headers == {"Retry-After": "3"}
    for path in ("/v1/chat/completions", "/v1/messagesx", ""):
        assert set(orjson.loads(error_body(error, path)[0])) == {"error"}


def _request(**fields: object) -> MessagesRequest:
    return MessagesRequest.model_validate({"model": "m", "max_tokens": 8, **fields})


def test_param_map_names_the_clients_own_fields() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}
    wire = _request(
        system="s",
        messages=[
            {"role": "user", "content": "call it"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"},
                    image,
                    {"type": "text", "text": "and this?"},
                ],
            },
        ],
    )
    request, params = messages_request(wire, "r", 0.0, ThoughtSeal(None))
    roles = [message.role for message in request.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert params("messages[0]") == "system"
    assert params("messages[2]") == "messages[1]"
    assert params("messages[3]") == "messages[2].content[0]"
    assert params("messages[4].content[0]") == "messages[2].content[1]"
    assert params("messages[4].content[1]") == "messages[2].content[2]"
    assert params("messages[9]") == "messages"
    assert params("stop") == "stop_sequences" and params("max_completion_tokens") == "max_tokens"
    assert params("tools[0].function.parameters") == "tools[0].function.parameters"


def test_assembler_blocks_and_stop_reasons() -> None:
    output = MessageAssembler()
    frames = output.feed(TextDelta(0, "Let me check."))
    frames += output.feed(ToolCallDelta(0, 0, id="call_ab", name="f"))
    frames += output.feed(ToolCallDelta(0, 0, arguments_fragment='{"city": "Oslo", "da'))
    frames += output.feed(Finished(0, "length"))
    frames += output.feed(Usage(5, 9))
    frames += output.finish()
    kinds = [orjson.loads(frame.split(b"\ndata: ")[1])["type"] for frame in frames]
    assert kinds == [
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    # Cut by max_tokens: the partial arguments read as far as they got, as the SDK's
    # stream accumulator reads them (an unfinished string or key is left out).
    assert output.content == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_ab", "name": "f", "input": {"city": "Oslo"}},
    ]
    assert output.stop_reason == "max_tokens"
    called = MessageAssembler()
    called.feed(ToolCallDelta(0, 0, id="call_x", name="f", arguments_fragment="{}"))
    called.feed(Finished(0, "stop"))
    assert called.stop_reason == "tool_use"
    stopped = MessageAssembler()
    stopped.feed(Finished(0, "stop", stop_sequence="END"))
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")
    assert stopped.content == [] and stopped.finish() == [b'event: ping\ndata: {"type":"ping"}\n\n']
