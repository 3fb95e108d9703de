"""The closer behind budget-aware decoding, on SmolLM2's tokenizer and real xgrammar
grammars: from any prefix the grammar allows, the closing it finds completes a value
that parses and validates, the live matcher is left as it was, and the forced tokens
are ones the matcher accepts."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jsonschema
import pytest

from backends.base import ResponseFormat, ToolChoice, ToolSpec
from backends.hf.constrained.grammar import Constraint, GrammarBook, check_budget, new_matcher
from backends.process_wide import exclusive
from tests.hf.helpers import chat, model_path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 5, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "minItems": 1},
        "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "tags", "inner", "score"],
    "additionalProperties": False,
}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def book() -> GrammarBook:
    with exclusive("test tokenizer"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path())
        return GrammarBook(tokenizer, vocab_size=49152, stop_ids=[tokenizer.eos_token_id])


def _schema_constraint(book: GrammarBook, schema: dict[str, Any]) -> Constraint:
    fmt = ResponseFormat("json_schema", name="s", schema=schema)
    found = book.compile(dataclasses.replace(chat("x", 8), response_format=fmt))
    assert found is not None and found.closer is not None
    return found


def _closed(constraint: Constraint, prefix: str | bytes) -> bytes:
    matcher = new_matcher(constraint)
    assert matcher.accept_string(prefix)
    closer = constraint.closer
    assert closer is not None
    closing = closer.closing(matcher)
    assert closing is not None
    ids = closer.tokens(matcher, closing)
    assert ids is not None and len(ids) <= len(closing)
    # The matcher is unchanged: the same closing again, and the forced tokens complete it.
    assert closer.closing(matcher) == closing
    for token in ids:
        assert matcher.accept_token(token)
    assert matcher.is_completed()
    raw = prefix if isinstance(prefix, bytes) else prefix.encode()
    return raw + closing


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "{",
        '{"na',
        '{"name": "a long string that wanders and \\',
        '{"name": "x", "age": 1',
        '{"name": "x", "age": 12, "tags": ["re',
        '{"name": "x", "age": 12, "tags": ["red"], "inner": {',
        '{"name": "x", "age": 12, "tags": ["red"], "inner": {"ok": true}, "score": -1.',
        '{"name": "x", "age": 12, "tags": ["red"], "inner": {"ok": true}, "score": 2e',
        b'{"name": "caf\xc3',  # a token ended inside a two-byte character
    ],
)
def test_closing_completes_a_valid_value(book: GrammarBook, prefix: str | bytes) -> None:
    value = json.loads(_closed(_schema_constraint(book, SCHEMA), prefix))
    jsonschema.validate(value, SCHEMA)


def test_a_tool_call_closes_with_its_wrapper(book: GrammarBook) -> None:
    tool = ToolSpec("get_weather", None, CITY)
    request = dataclasses.replace(
        chat("x", 8), tools=(tool,), tool_choice=ToolChoice("named", "get_weather")
    )
    constraint = book.compile(request)
    assert constraint is not None
    for prefix in ("", "<tool_call>\n", '<tool_call>\n{"name": "get_weather", "arguments": {"ci'):
        text = _closed(constraint, prefix).decode()
        assert text.startswith("<tool_call>\n") and text.endswith("}\n</tool_call>")
        call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        assert call["name"] == "get_weather"
        jsonschema.validate(call["arguments"], CITY)


def test_min_tokens_is_the_shortest_value_and_refuses_below(book: GrammarBook) -> None:
    constraint = _schema_constraint(book, CITY)
    shortest = _closed(constraint, "")
    assert json.loads(shortest) == {"city": ""}
    assert 0 < constraint.min_tokens <= len(shortest)
    fmt = ResponseFormat("json_schema", name="s", schema=CITY)
    request = dataclasses.replace(chat("x", constraint.min_tokens - 1), response_format=fmt)
    with pytest.raises(Exception) as caught:
        check_budget(constraint, request)
    assert getattr(caught.value, "param", None) == "max_tokens"
    assert str(constraint.min_tokens) in str(caught.value)
    check_budget(constraint, dataclasses.replace(request, sampling=chat("x", 99).sampling))


def test_auto_tools_owe_nothing_before_a_call(book: GrammarBook) -> None:
    tool = ToolSpec("get_weather", None, CITY)
    request = dataclasses.replace(chat("x", 8), tools=(tool,), tool_choice=ToolChoice("auto"))
    constraint = book.compile(request)
    assert constraint is not None and constraint.min_tokens == 0
    matcher = new_matcher(constraint)
    assert matcher.accept_string("Some text first. ")
    assert constraint.closer is not None and constraint.closer.closing(matcher) == b""
    assert matcher.accept_string("<tool_call>\n")
    closing = constraint.closer.closing(matcher)
    assert closing is not None and closing.endswith(b"}\n</tool_call>")
