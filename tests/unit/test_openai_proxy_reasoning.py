"""The openai relay and reasoning: the upstream's thought fields read, the content split
here where the model names a parser, reasoning tokens counted, controls forwarded."""

from __future__ import annotations

import orjson
import pytest

from backends.base import (
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    ReasoningControls,
    ReasoningDelta,
    RequestKind,
    SamplingParams,
    TextDelta,
)
from backends.openai_proxy.engines import profile_for
from backends.openai_proxy.payload import request_body
from backends.openai_proxy.stream import ChunkTranslator
from backends.reasoning import reasoning_format


def _chunk(index: int = 0, finish: str | None = None, **delta: object) -> bytes:
    choice: dict[str, object] = {"index": index, "delta": delta}
    if finish is not None:
        choice["finish_reason"] = finish
    return orjson.dumps({"choices": [choice]})


def _usage(completion: int, reasoning: int) -> bytes:
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }
    return orjson.dumps({"choices": [], "usage": usage})


def _relay(translator: ChunkTranslator, reads: list[list[bytes]]) -> list[BackendEvent]:
    out: list[BackendEvent] = []
    for payloads in reads:
        translator.translate_all(payloads, out)
    translator.finish(out)
    return out


def _joined(events: list[BackendEvent]) -> tuple[str, str]:
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return thought, answer


@pytest.mark.parametrize("name", ["reasoning", "reasoning_content"])
def test_upstream_thought_fields_are_read(name: str) -> None:
    """vLLM 0.32 sends ``reasoning`` only, and reports 0 reasoning tokens: counted here."""
    translator = ChunkTranslator(chat=True, n=1)
    reads = [
        [_chunk(role="assistant", content="")],
        [_chunk(**{name: "Let "}), _chunk(**{name: "me."})],  # one read: merged
        [_chunk(content="Paris")],
        [_chunk(finish="stop"), _usage(4, 0), b"[DONE]"],
    ]
    events = _relay(translator, reads)
    assert events == [ReasoningDelta(0, "Let me.", 2), TextDelta(0, "Paris"), Finished(0, "stop")]
    assert translator.reasoning_tokens == 2


def test_the_upstreams_reasoning_count_wins() -> None:
    translator = ChunkTranslator(chat=True, n=1)
    _relay(translator, [[_chunk(reasoning="a"), _chunk(finish="stop"), _usage(9, 7)]])
    assert translator.reasoning_tokens == 7


def test_a_chunk_with_thought_and_content_gives_both_in_order() -> None:
    translator = ChunkTranslator(chat=True, n=1)
    events = _relay(translator, [[_chunk(reasoning="end", content="start")]])
    assert events[:2] == [ReasoningDelta(0, "end", 1), TextDelta(0, "start", num_tokens=0)]


def _split_here(name: str, thinking: bool | None = None) -> ChunkTranslator:
    fmt = reasoning_format(name)
    return ChunkTranslator(
        chat=True, n=1, reasoning=fmt, in_thought=fmt.starts_in_thought(None, thinking)
    )


def test_content_is_split_here_when_the_upstream_does_not() -> None:
    """Token by token, as a server without a reasoning parser streams it."""
    text = "Hmm, let me think.</think>\n\nParis."
    translator = _split_here("deepseek_r1")
    reads = [[_chunk(content=piece)] for piece in [text[:8], text[8:20], text[20:24], text[24:]]]
    events = _relay(translator, [*reads, [_chunk(finish="stop")]])
    assert _joined(events) == ("Hmm, let me think.", "\n\nParis.")
    assert "<think>" not in _joined(events)[1] and "</think>" not in _joined(events)[1]
    assert translator.reasoning_tokens == 3  # the chunks that carried thought
    assert sum(e.num_tokens for e in events if isinstance(e, TextDelta | ReasoningDelta)) == 4


def test_a_parser_with_thinking_off_starts_in_the_answer() -> None:
    translator = _split_here("deepseek_r1", thinking=False)
    events = _relay(translator, [[_chunk(content="plain")], [_chunk(finish="stop")]])
    assert _joined(events) == ("", "plain")


def test_a_marker_cut_at_the_end_is_flushed_before_finished() -> None:
    translator = _split_here("qwen3")
    events = _relay(translator, [[_chunk(content="<thi")], [_chunk(finish="length")]])
    assert events == [TextDelta(0, "<thi", num_tokens=1), Finished(0, "length")]


def test_the_upstreams_own_split_turns_the_parser_off() -> None:
    translator = _split_here("deepseek_r1")
    reads = [[_chunk(reasoning="thought")], [_chunk(content="answer</think>")]]
    events = _relay(translator, [*reads, [_chunk(finish="stop")]])
    assert _joined(events) == ("thought", "answer</think>")


def test_completions_are_relayed_raw() -> None:
    fmt = reasoning_format("deepseek_r1")
    translator = ChunkTranslator(chat=False, n=1, reasoning=fmt, in_thought=True)
    payload = orjson.dumps({"choices": [{"index": 0, "text": "a</think>b"}]})
    events = _relay(translator, [[payload]])
    assert events[0] == TextDelta(0, "a</think>b")


def _request(controls: ReasoningControls, *messages: ChatMessage) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(),
        messages=messages or (ChatMessage("user", "hi"),),
        reasoning=controls,
    )


def _body(request: GenerationRequest) -> dict[str, object]:
    return request_body(request, "m", stream=True, send_ignore_eos=True)


def test_controls_become_vllms_fields() -> None:
    controls = ReasoningControls(
        effort="xhigh", thinking=False, budget_tokens=32, template_kwargs='{"custom": 1}'
    )
    body = _body(_request(controls))
    assert body["reasoning_effort"] == "xhigh"
    assert body["chat_template_kwargs"] == {"custom": 1, "enable_thinking": False}
    assert body["thinking_token_budget"] == 32


def test_no_controls_no_fields() -> None:
    body = _body(_request(ReasoningControls()))
    assert not {"reasoning_effort", "chat_template_kwargs", "thinking_token_budget"} & set(body)


def test_effort_none_is_also_the_switch() -> None:
    body = _body(_request(ReasoningControls(effort="none", thinking=False)))
    assert body["reasoning_effort"] == "none"
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_an_earlier_thought_goes_back_under_both_names() -> None:
    turns = (
        ChatMessage("user", "hi"),
        ChatMessage("assistant", "hello", reasoning="they greet"),
        ChatMessage("user", "and?"),
    )
    messages = _body(_request(ReasoningControls(), *turns))["messages"]
    assert isinstance(messages, list)
    assert messages[1]["reasoning"] == messages[1]["reasoning_content"] == "they greet"
    assert "reasoning" not in messages[0] and "reasoning_content" not in messages[0]


def test_only_vllm_takes_a_budget() -> None:
    from backends.base import Feature

    assert Feature.THINKING_BUDGET in profile_for("vllm").features
    for engine in ("generic", "llamacpp", "mlx"):
        features = profile_for(engine).features
        assert Feature.REASONING in features and Feature.THINKING_BUDGET not in features
