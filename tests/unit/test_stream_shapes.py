"""The relay's fast path (``backends.openai_proxy.shapes``): a payload recognised by its
bytes gives exactly the events, counts and errors of the full JSON parse, on chunks as
vLLM, llama.cpp and mlx-lm write them, and for any content string."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import BackendError, BackendEvent
from backends.openai_proxy import stream
from backends.openai_proxy.shapes import learn, string_body
from backends.openai_proxy.stream import DONE, ChunkTranslator, SSEDecoder
from backends.reasoning import reasoning_format

# ---------------------------------------------------------------- a corpus of real shapes


def _vllm(choice: dict[str, Any] | None = None, **extra: Any) -> bytes:
    head = {
        "id": "chatcmpl-9f1c",
        "object": "chat.completion.chunk",
        "created": 1733000000,
        "model": "Qwen/Qwen3-0.6B",
    }
    return orjson.dumps({**head, "choices": [] if choice is None else [choice], **extra})


def _vllm_delta(delta: dict[str, Any], finish: str | None = None, **rest: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **rest}
    return _vllm(choice)


def _vllm_text(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1733000000, "model": "m"}
    return orjson.dumps({**head, "choices": [choice]})


def _llamacpp(delta: dict[str, Any], finish: str | None = None, created: int = 1733000000) -> bytes:
    # llama.cpp's server: choices first, `created` stamped with the current second.
    return orjson.dumps(
        {
            "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
            "created": created,
            "id": "chatcmpl-Lq2",
            "model": "gpt-3.5-turbo",
            "system_fingerprint": "b4570-9f3b",
            "object": "chat.completion.chunk",
        }
    )


def _mlx(content: str, finish: str | None = None) -> bytes:
    # mlx-lm: Python's json.dumps (spaces after separators, non-ASCII escaped), the role
    # repeated on every delta.
    chunk = {
        "id": "chatcmpl-7",
        "system_fingerprint": "0.21.0",
        "object": "chat.completion.chunk",
        "model": "mlx-community/Qwen3-0.6B-4bit",
        "created": 1733000000,
        "choices": [
            {
                "index": 0,
                "finish_reason": finish,
                "delta": {"role": "assistant", "content": content},
            }
        ],
    }
    return json.dumps(chunk).encode()


EMPTY_DELTA = _vllm_delta({"content": ""})
USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
WORDS = [" Paris", " is", ' "the"', " capital", " of", " café", " 😀", "\\n", "\n", "a\\b"]

CORPUS: dict[str, list[bytes]] = {
    "vllm": [
        _vllm_delta({"role": "assistant", "content": ""}),
        *(_vllm_delta({"content": word}) for word in WORDS[:3]),
        EMPTY_DELTA,  # a token that ends inside a UTF-8 character
        *(_vllm_delta({"content": word}) for word in WORDS[3:]),
        _vllm_delta({"content": ""}, "stop", stop_reason=None),
        _vllm(usage=USAGE),
    ],
    "vllm-reasoning": [
        _vllm_delta({"role": "assistant", "content": ""}),
        *(_vllm_delta({"reasoning": word}) for word in WORDS[:4]),
        *(_vllm_delta({"reasoning_content": word}) for word in WORDS[4:6]),
        *(_vllm_delta({"content": word}) for word in WORDS),
        _vllm_delta({"content": ""}, "stop"),
        _vllm(usage={**USAGE, "completion_tokens_details": {"reasoning_tokens": 6}}),
    ],
    "vllm-tools": [
        _vllm_delta({"role": "assistant", "content": ""}),
        _vllm_delta({"content": "Let me look."}),
        _vllm_delta(
            {
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-1",
                        "type": "function",
                        "index": 0,
                        "function": {"name": "get_weather"},
                    }
                ]
            }
        ),
        _vllm_delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        _vllm_delta({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        _vllm_delta({"content": ""}, "tool_calls"),
        _vllm(usage=USAGE),
    ],
    "vllm-logprobs": [
        _vllm_delta({"role": "assistant", "content": ""}),
        *(
            orjson.dumps(
                {
                    "id": "c",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": word},
                            "logprobs": {
                                "content": [
                                    {
                                        "token": word,
                                        "logprob": -0.25,
                                        "bytes": list(word.encode()),
                                        "top_logprobs": [{"token": word, "logprob": -0.25}],
                                    }
                                ]
                            },
                            "finish_reason": None,
                        }
                    ],
                }
            )
            for word in WORDS[:3]
        ),
        _vllm_delta({"content": ""}, "length"),
    ],
    "vllm-n2": [
        *(
            orjson.dumps({"choices": [{"index": i, "delta": {"content": w}, "logprobs": None}]})
            for w in WORDS[:4]
            for i in (0, 1)
        ),
        _vllm_delta({"content": ""}, "stop"),
        # after its finish: dropped
        orjson.dumps({"choices": [{"index": 0, "delta": {"content": " late"}, "logprobs": None}]}),
        orjson.dumps({"choices": [{"index": 1, "delta": {}, "finish_reason": "length"}]}),
    ],
    "llamacpp": [
        _llamacpp({"role": "assistant", "content": None}),
        *(
            _llamacpp({"content": word}, created=1733000000 + i // 3)
            for i, word in enumerate(WORDS)
        ),
        _llamacpp({"reasoning_content": " hm"}),
        _llamacpp({}, "stop"),
        orjson.dumps(
            {
                "choices": [{"finish_reason": "stop", "index": 0, "delta": {}}],
                "usage": USAGE,
                "timings": {"predicted_ms": 12.5},
            }
        ),
    ],
    "mlx-lm": [
        *(_mlx(word) for word in WORDS),
        _mlx("", "stop"),
        json.dumps({"object": "chat.completion", "choices": [], "usage": USAGE}).encode(),
    ],
}
COMPLETIONS = [_vllm_text(word) for word in WORDS] + [_vllm_text("", "stop")]


# ---------------------------------------------------------------- the comparison


@contextmanager
def _full_parse_only() -> Iterator[None]:
    """No shape is ever learnt: every payload takes the JSON parse (the reference)."""
    with mock.patch.object(stream, "learn", return_value=None):
        yield


def _translate(
    reads: list[list[bytes]], *, chat: bool = True, n: int = 1, parser: str | None = None
) -> tuple[list[BackendEvent], tuple[Any, ...]]:
    """The events (with ``finish``) and final counts, or the error, of ``reads``."""
    translator = ChunkTranslator(
        chat=chat, n=n, reasoning=reasoning_format(parser) if parser else None
    )
    out: list[BackendEvent] = []
    try:
        for read in reads:
            translator.translate_all(read, out)
        translator.finish(out)
    except BackendError as exc:
        return out, (type(exc), str(exc))
    counts = (
        translator.counted_tokens,
        translator.counted_reasoning,
        translator.reported_reasoning,
        translator.usage,
        translator.done,
    )
    return out, counts


def _both(reads: list[list[bytes]], **kwargs: Any) -> tuple[Any, Any]:
    fast = _translate(reads, **kwargs)
    with _full_parse_only():
        full = _translate(reads, **kwargs)
    return fast, full


def _groupings(payloads: list[bytes]) -> Iterator[list[list[bytes]]]:
    yield [[p] for p in payloads]  # a token-by-token stream: one chunk per read
    yield [[*payloads, DONE]]  # everything in one read
    yield [payloads[i : i + 3] for i in range(0, len(payloads), 3)] + [[b"", DONE]]


@pytest.mark.parametrize("engine", sorted(CORPUS))
def test_every_engines_chunks_translate_as_the_full_parse(engine: str) -> None:
    for reads in _groupings(CORPUS[engine]):
        fast, full = _both(reads, n=2 if engine == "vllm-n2" else 1)
        assert fast == full


@pytest.mark.parametrize("engine", sorted(CORPUS))
def test_a_splitting_parser_sees_the_same_text(engine: str) -> None:
    for reads in _groupings(CORPUS[engine]):
        fast, full = _both(reads, parser="deepseek_r1")
        assert fast == full


def test_completions_translate_as_the_full_parse() -> None:
    for reads in _groupings(COMPLETIONS):
        fast, full = _both(reads, chat=False)
        assert fast == full


@pytest.mark.parametrize("engine", ["vllm", "mlx-lm", "llamacpp"])
def test_plain_deltas_skip_the_parser(engine: str) -> None:
    """After the first content delta taught the shape, the plain ones are not parsed
    (llama.cpp: once more each time its ``created`` second changes)."""
    payloads = CORPUS[engine]
    parsed: list[bytes] = []
    decode = ChunkTranslator._decode

    def counting(self: ChunkTranslator, values: list[bytes]) -> list[Any]:
        parsed.extend(values)
        return decode(self, values)

    with mock.patch.object(ChunkTranslator, "_decode", counting):
        _translate([[p] for p in payloads])
    plain = [p for p in payloads if learn(orjson.loads(p), p, chat=True) is not None]
    assert len(plain) == len(WORDS) + (engine == "llamacpp")  # its one thought too
    relearnt = 4 + 1 if engine == "llamacpp" else 1  # four `created` seconds, a thought
    assert len([p for p in parsed if p in plain]) == relearnt
    shaped = len(plain) + payloads.count(EMPTY_DELTA)
    assert len(parsed) == len(payloads) - shaped + relearnt


def test_a_stream_whose_deltas_never_repeat_a_shape_stops_learning() -> None:
    """llama.cpp with ``timings_per_token``: each delta carries its own counters, so no
    shape ever matches; after a few tries the stream stops paying for learning, and its
    events are still the full parse's."""
    payloads = [
        orjson.dumps(
            {
                "choices": [{"finish_reason": None, "index": 0, "delta": {"content": word}}],
                "timings": {"predicted_n": i, "predicted_ms": 10.5 * i},
            }
        )
        for i, word in enumerate(WORDS * 2)
    ]
    calls: list[bytes] = []

    def counting(chunk: Any, payload: bytes, *, chat: bool) -> Any:
        calls.append(payload)
        return learn(chunk, payload, chat=chat)

    with mock.patch.object(stream, "learn", counting):
        fast = _translate([[p] for p in payloads])
    assert len(calls) == 4  # stream._MAX_UNUSED
    with _full_parse_only():
        assert fast == _translate([[p] for p in payloads])


def test_a_thought_shape_is_learnt_like_a_content_shape() -> None:
    payload = _vllm_delta({"reasoning": " hm"})
    shape = learn(orjson.loads(payload), payload, chat=True)
    assert shape is not None and shape.thought
    assert shape.text(_vllm_delta({"reasoning": 'a "b"'})) == 'a "b"'
    assert shape.text(_vllm_delta({"content": " hm"})) is None


def test_only_a_plain_delta_teaches_a_shape() -> None:
    not_plain = [
        _vllm_delta({"content": ""}),
        _vllm_delta({"content": "x"}, "stop"),
        _vllm_delta({"content": "x", "reasoning": "y"}),
        _vllm_delta({"reasoning": "x", "reasoning_content": "x"}),
        _vllm_delta({"content": "x", "tool_calls": [{"index": 0}]}),
        _vllm(choice={"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}}),
        _vllm(choice={"index": 0, "delta": {"content": "x"}}, usage=USAGE),
        # a second `content` key elsewhere: which string is the text is not sure
        _vllm(choice={"index": 0, "delta": {"content": "x"}, "message": {"content": "x"}}),
        orjson.dumps({"error": {"message": "x"}, "choices": [{"delta": {"content": "x"}}]}),
    ]
    for payload in not_plain:
        assert learn(orjson.loads(payload), payload, chat=True) is None, payload


def test_a_key_is_found_where_json_puts_keys() -> None:
    """A key of another name that ends like ``"content"`` neither hides the real one nor
    counts as a second one."""
    payload = orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}], 'a"content': "x"})
    shape = learn(orjson.loads(payload), payload, chat=True)
    assert shape is not None
    assert shape.text(payload.replace(b'"x"}}]', b'"yz"}}]')) == "yz"


def test_text_that_imitates_the_shape_is_still_one_string() -> None:
    """Content holding the bytes of keys and quotes never moves the string's bounds."""
    learnt = _vllm_delta({"content": "x"})
    tricky = [
        '"},"logprobs":null,"finish_reason":"stop"}]}',
        ',"content":"y',
        "\\",
        '\\"',
        "{}",
    ]
    for text in tricky:
        reads = [[learnt], [_vllm_delta({"content": text})], [_vllm_delta({}, "stop")]]
        fast, full = _both(reads)
        assert fast == full
        assert fast[0][1].text == text  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "middle",
    [b"a\x01b", b"caf\xc3", b"\xed\xa0\x80", b'a"b', b"a\\", b"\\x", b"\\ud800", b'","x":"'],
)
def test_a_bad_string_in_a_known_shape_fails_as_the_parse_does(middle: bytes) -> None:
    learnt = _vllm_delta({"content": "x"})
    prefix, _, suffix = learnt.partition(b'"x"')
    bad = prefix + b'"' + middle + b'"' + suffix
    fast, full = _both([[learnt], [bad], [DONE]])
    assert fast == full


# ---------------------------------------------------------------- properties


ENCODERS = {
    "orjson": orjson.dumps,
    "ascii": lambda value: json.dumps(value).encode(),
    "utf-8": lambda value: json.dumps(value, ensure_ascii=False).encode(),
}


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(), min_size=1, max_size=4), encoder=st.sampled_from(sorted(ENCODERS)))
def test_any_content_round_trips_through_the_fast_path(texts: list[str], encoder: str) -> None:
    encode = ENCODERS[encoder]
    head = b'{"id":"c","choices":[{"index":0,"delta":{"content":'
    tail = b'},"logprobs":null,"finish_reason":null}]}'
    reads = [[head + encode("first") + tail]] + [[head + encode(text) + tail] for text in texts]
    fast, full = _both(reads)
    assert fast == full
    assert "".join(e.text for e in fast[0] if hasattr(e, "text")) == "first" + "".join(texts)


@settings(max_examples=500, deadline=None)
@given(body=st.binary(max_size=24) | st.text(max_size=12).map(lambda t: orjson.dumps(t)[1:-1]))
def test_a_string_body_decodes_as_orjson_decodes_it(body: bytes) -> None:
    try:
        expected = orjson.loads(b'"' + body + b'"')
    except orjson.JSONDecodeError:
        expected = None
    assert string_body(body) == expected


# ---------------------------------------------------------------- the SSE decoder


def _lines(data: bytes, tail: bytes) -> tuple[list[bytes], bytes]:
    """The decoder's general path, written out: split lines, keep the partial last."""
    lines = (tail + data).split(b"\n")
    rest = lines.pop()
    return [line[5:].strip() for line in lines if line.startswith(b"data:")], rest


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(st.sampled_from(CORPUS["vllm"] + [DONE, b""]), max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=4),
    separator=st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]),
)
def test_the_decoder_splits_any_reads_as_the_line_split(
    events: list[bytes], cuts: list[int], separator: bytes
) -> None:
    data = b"".join(b"data: " + event + separator for event in events)
    bounds = [0, *sorted(min(cut, len(data)) for cut in cuts), len(data)]
    decoder = SSEDecoder()
    tail = b""
    for start, end in itertools.pairwise(bounds):
        expected, tail = _lines(data[start:end], tail)
        assert decoder.feed(data[start:end]) == expected
