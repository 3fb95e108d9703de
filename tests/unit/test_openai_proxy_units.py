"""Pure parts of the openai proxy: body building, SSE parsing, error mapping, health."""

from __future__ import annotations

from dataclasses import replace

import orjson
import pytest

from backends.base import (
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    Overloaded,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    ToolCallDelta,
    UpstreamBadResponse,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from backends.openai_proxy.engines import profile_for, split_base_url
from backends.openai_proxy.errors import from_status, is_retryable
from backends.openai_proxy.payload import build_body
from backends.openai_proxy.stream import DONE, ChunkTranslator, SSEDecoder
from backends.replicas.health import CircuitBreaker, HealthTracker


def _request(kind: RequestKind = RequestKind.CHAT, **sampling: object) -> GenerationRequest:
    return GenerationRequest(
        request_id="r1",
        model="m",
        kind=kind,
        sampling=SamplingParams(**{"max_tokens": 7, **sampling}),  # type: ignore[arg-type]
        messages=(ChatMessage("user", "hi"),) if kind is RequestKind.CHAT else (),
        prompt="Once" if kind is RequestKind.COMPLETION else "",
    )


# ---------------------------------------------------------------- payload


def test_chat_body_is_minimal_and_streams_with_usage() -> None:
    path, raw = build_body(_request(temperature=0.0), "up", profile_for("generic"))
    body = orjson.loads(raw)
    assert path == "/chat/completions"
    assert body == {
        "model": "up",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 7,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_json_object_with_a_schema_goes_as_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = replace(_request(), response_format=ResponseFormat("json_object", schema=schema))
    for engine in ("vllm", "generic", "llamacpp"):
        body = orjson.loads(build_body(request, "up", profile_for(engine))[1])
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "schema", "schema": schema},
        }


def test_completion_body_maps_every_sampling_field() -> None:
    request = _request(
        RequestKind.COMPLETION,
        top_p=0.9,
        top_k=5,
        seed=3,
        stop=("\n",),
        n=2,
        logprobs=2,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        ignore_eos=True,
    )
    path, raw = build_body(request, "up", profile_for("vllm"))
    body = orjson.loads(raw)
    assert path == "/completions"
    assert body["prompt"] == "Once"
    assert (body["top_p"], body["top_k"], body["seed"], body["n"]) == (0.9, 5, 3, 2)
    assert body["stop"] == ["\n"] and body["logprobs"] == 2
    assert (body["presence_penalty"], body["frequency_penalty"]) == (0.5, 0.25)
    assert body["ignore_eos"] is True


def test_max_tokens_only_when_set_and_chat_logprobs_shape() -> None:
    request = GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(logprobs=3),
        messages=(ChatMessage("user", "x"),),
        user="u1",
    )
    body = orjson.loads(build_body(request, "up", profile_for("llamacpp"))[1])
    assert "max_tokens" not in body
    # The model's default_max_tokens fills in for the client's; the client's wins.
    profile = profile_for("llamacpp")
    body = orjson.loads(build_body(request, "up", profile, default_max_tokens=50)[1])
    assert body["max_tokens"] == 50
    explicit = replace(request, sampling=replace(request.sampling, max_tokens=7))
    body = orjson.loads(build_body(explicit, "up", profile, default_max_tokens=50)[1])
    assert body["max_tokens"] == 7
    assert body["logprobs"] is True and body["top_logprobs"] == 3
    assert body["user"] == "u1"
    assert "top_k" not in body and "ignore_eos" not in body


def test_base_url_forms() -> None:
    assert split_base_url("http://h:1/v1/") == ("http://h:1", "http://h:1/v1")
    assert split_base_url("http://h:1") == ("http://h:1", "http://h:1/v1")
    assert profile_for("mlx", "ping").health_path == "/ping"


# ---------------------------------------------------------------- SSE


def test_sse_decoder_joins_partial_lines_and_skips_noise() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b': comment\n\ndata: {"a"') == []
    assert decoder.feed(b":1}\r\n\nevent: x\ndata:[DONE]\n\n") == [b'{"a":1}', b"[DONE]"]
    assert decoder.feed(b"data: tail") == []
    assert decoder.flush() == [b"tail"]


def _chunk(**choice: object) -> bytes:
    return orjson.dumps({"object": "chat.completion.chunk", "choices": [choice]})


def test_translator_chat_deltas_finish_and_usage() -> None:
    t = ChunkTranslator(chat=True, n=1)
    out: list[BackendEvent] = []
    t.translate_all([_chunk(index=0, delta={"role": "assistant", "content": ""})], out)
    assert out == []
    t.translate_all([_chunk(index=0, delta={"content": "Hi"}, logprobs=None)], out)
    t.translate_all([_chunk(index=0, delta={}, finish_reason="length")], out)
    # mlx-lm labels its usage chunk like a full completion, with a message: ignored text.
    usage_chunk = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    t.translate_all([orjson.dumps(usage_chunk)], out)
    t.translate_all([b"[DONE]"], out)
    assert out == [TextDelta(0, "Hi"), Finished(0, "length")]
    assert t.usage == (5, 1) and t.done and t.all_finished
    assert t.reported_cached == 0  # an upstream that says nothing about its cache


def test_translator_reads_the_upstreams_cached_prompt_tokens() -> None:
    t = ChunkTranslator(chat=True, n=1)
    usage = {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 32, "audio_tokens": None},
    }
    t.translate_all([orjson.dumps({"choices": [], "usage": usage})], [])
    assert t.usage == (40, 2) and t.reported_cached == 32


def test_translator_names_the_stop_string_vllm_reports() -> None:
    """vLLM's ``stop_reason``: the matched stop string, a stop token id, or null."""
    for stop_reason, expected in (("END", "END"), (128009, None), (None, None)):
        t = ChunkTranslator(chat=True, n=1)
        out: list[BackendEvent] = []
        t.translate_all(
            [_chunk(index=0, delta={}, finish_reason="stop", stop_reason=stop_reason)], out
        )
        assert out == [Finished(0, "stop", stop_sequence=expected)]


def test_translator_completion_logprobs_sorted_and_fallback_count() -> None:
    t = ChunkTranslator(chat=False, n=2)
    out: list[BackendEvent] = []
    lp = {"tokens": ["a"], "token_logprobs": [-0.1], "top_logprobs": [{"b": -3.0, "a": -0.1}]}
    t.translate_all([orjson.dumps({"choices": [{"index": 1, "text": "a", "logprobs": lp}]})], out)
    t.translate_all([orjson.dumps({"choices": [{"index": 0, "text": "b"}]})], out)
    delta = out[0]
    assert isinstance(delta, TextDelta) and delta.index == 1
    assert [x.token for x in delta.logprobs[0].top] == ["a", "b"]
    assert delta.logprobs[0].bytes == (97,)
    assert t.counted_tokens == 2 and t.usage is None
    t.finish(out)
    assert out[-2:] == [Finished(0, "stop"), Finished(1, "stop")]


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"{nope", "invalid JSON"),
        (b"[1]", "not an object"),
        (b'{"error": {"message": "oom"}}', "oom"),
    ],
)
def test_translator_rejects_garbage_and_error_events(payload: bytes, needle: str) -> None:
    with pytest.raises(UpstreamBadResponse, match=needle):
        ChunkTranslator(chat=True, n=1).translate_all([payload], [])


# ---------------------------------------------------------------- errors


def test_status_mapping_keeps_4xx_details() -> None:
    error = {"message": "bad temp", "type": "BadRequestError", "param": "temperature", "code": 400}
    body = orjson.dumps({"error": error})
    err = from_status(400, body)
    assert isinstance(err, UpstreamRejected)
    assert (err.status, err.message, err.param, err.code) == (400, "bad temp", "temperature", None)
    ctx = from_status(400, b'{"error": {"message": "maximum context length is 2048 tokens"}}')
    assert ctx.code == "context_length_exceeded"
    detail = from_status(422, b'{"detail": [{"msg": "field required"}]}')
    assert detail.status == 422 and detail.message == "field required"
    assert from_status(404, b"plain text").message == "plain text"


def test_status_mapping_5xx_and_retry_classes() -> None:
    busy = from_status(429, b"{}", "3")
    assert isinstance(busy, Overloaded) and busy.retry_after == 3.0
    assert isinstance(from_status(503, b""), UpstreamUnavailable)
    assert isinstance(from_status(504, b""), UpstreamTimeout)
    assert isinstance(from_status(500, b""), UpstreamBadResponse)
    assert is_retryable(from_status(502, b"")) and is_retryable(busy)
    assert not is_retryable(from_status(500, b"")) and not is_retryable(from_status(400, b""))


# ---------------------------------------------------------------- health


def test_health_hysteresis() -> None:
    h = HealthTracker(failures_down=2, successes_up=3)
    assert not h.up
    assert h.record(True)  # first success: up at once
    assert h.record(False) and not h.record(False)  # second failure: down
    assert not h.record(True) and not h.record(True)
    assert not h.record(False)  # a failure resets the success streak
    assert not h.record(True) and not h.record(True) and h.record(True)


def test_breaker_opens_cools_down_and_closes() -> None:
    b = CircuitBreaker(threshold=2, cooldown=10.0)
    b.record_failure(0.0)
    assert b.check(0.0).allowed
    b.record_failure(1.0)
    decision = b.check(2.0)
    assert not decision.allowed and decision.retry_after == pytest.approx(9.0)
    assert b.check(11.0).allowed  # half-open
    b.record_failure(11.0)  # the probe failed: open again
    assert not b.check(12.0).allowed
    b.record_success()
    assert b.check(12.0).allowed and not b.is_open


def test_deltas_read_together_are_coalesced_per_choice() -> None:
    from backends.base import TokenLogprob

    lp = TokenLogprob("b", -1.0, (98,))
    wire_lp = {"content": [{"token": "b", "logprob": -1.0, "bytes": [98], "top_logprobs": []}]}
    call = {"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}
    payloads = [
        _chunk(index=0, delta={"content": "a"}),
        _chunk(index=0, delta={"content": "b"}, logprobs=wire_lp),
        _chunk(index=1, delta={"content": "x"}),
        _chunk(index=0, delta={"content": "c"}),
        _chunk(index=0, delta={"content": "d"}),
        _chunk(index=1, delta={"tool_calls": [call]}),
        _chunk(index=1, delta={"content": "y"}),
        _chunk(index=0, delta={"content": "e"}, finish_reason="stop"),
        _chunk(index=0, delta={"content": "late"}),  # after its finish: ignored
    ]
    t = ChunkTranslator(chat=True, n=2)
    out: list[BackendEvent] = []
    t.translate_all(payloads, out)
    assert out == [
        TextDelta(0, "ab", (lp,), 2),
        TextDelta(1, "x"),
        TextDelta(0, "cd", (), 2),
        ToolCallDelta(1, 0, "c1", "f", ""),
        TextDelta(1, "y"),
        TextDelta(0, "e"),
        Finished(0, "stop"),
    ]
    assert t.counted_tokens == 8
    single: list[BackendEvent] = []
    t.translate_all([_chunk(index=1, delta={"content": "z"})], single)
    assert single == [TextDelta(1, "z")]


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (b"{nope", "invalid JSON"),
        # Two objects on one data: line parse fine inside a joined array, not alone.
        (b'{"choices": []}, {"choices": []}', "invalid JSON"),
        (b"[1]", "not an object"),
        (b'{"error": {"message": "oom"}}', "oom"),
    ],
)
def test_a_bad_payload_among_a_read_is_refused_as_when_read_alone(bad: bytes, needle: str) -> None:
    payloads = [_chunk(index=0, delta={"content": "a"}), bad, _chunk(index=0, delta={})]
    with pytest.raises(UpstreamBadResponse, match=needle):
        ChunkTranslator(chat=True, n=1).translate_all(payloads, [])


def test_done_and_empty_payloads_in_a_read() -> None:
    t = ChunkTranslator(chat=True, n=1)
    out: list[BackendEvent] = []
    t.translate_all([_chunk(index=0, delta={"content": "a"}), b"", DONE], out)
    assert out == [TextDelta(0, "a")] and t.done


def test_scored_answer_becomes_prompt_logprobs_then_choices() -> None:
    """vLLM's whole answer to a scored prompt (prompt_logprobs: 1, return_token_ids),
    as the proxy turns it into events; max_tokens 0 ends at the prompt."""
    from backends.base import (
        Finished,
        GenerationRequest,
        PromptLogprobs,
        RequestKind,
        SamplingParams,
        TextDelta,
    )
    from backends.openai_proxy.scored import scored_body, scored_events

    scores = [
        None,
        {"7": {"logprob": -2.5, "rank": 3, "decoded_token": " b"},
         "9": {"logprob": -0.5, "rank": 1, "decoded_token": " x"}},
        {"8": {"logprob": -0.25, "rank": 1, "decoded_token": " c"}},
    ]  # fmt: skip
    payload = {
        "choices": [
            {"index": 0, "text": " d", "finish_reason": "length", "prompt_token_ids": [5, 7, 8],
             "prompt_logprobs": scores, "logprobs": None},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }  # fmt: skip
    request = GenerationRequest(
        "r", "m", RequestKind.COMPLETION, SamplingParams(max_tokens=1), prompt="a b c",
        prompt_logprobs=1,
    )  # fmt: skip
    body = orjson.loads(scored_body({"stream": True, "stream_options": {}}, request))
    assert body == {"stream": False, "prompt_logprobs": 1, "return_token_ids": True}
    events, usage = scored_events(payload, request)
    prompt = events[0]
    assert isinstance(prompt, PromptLogprobs)
    assert [t.token_id for t in prompt.tokens] == [5, 7, 8]
    assert prompt.tokens[0].logprob is None
    assert (prompt.tokens[1].logprob, prompt.tokens[1].rank) == (-2.5, 3)
    assert [(a.token_id, a.logprob) for a in prompt.tokens[1].top] == [(9, -0.5)]
    assert events[1:] == [TextDelta(0, " d", (), 1), Finished(0, "length")]
    assert usage == (3, 1)
    none = replace(request, sampling=SamplingParams(max_tokens=0))
    assert orjson.loads(scored_body({}, none))["echo"] is True
    events, usage = scored_events(payload, none)
    assert events[1:] == [Finished(0, "length")] and usage == (3, 0)
