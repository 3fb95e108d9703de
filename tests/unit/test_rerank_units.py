"""Units of rerank, score and tokenize: the edge's parsing and bodies, the pairs of a
``ScoreRequest``, cosine scores, a cross-encoder's activation, and the relay's upstream
bodies and answers."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest

from backends.base import ChatMessage, InvalidRequest, ToolSpec, UpstreamBadResponse
from backends.hf.embedding.backend import cosines
from backends.hf.embedding.cross_encoder import activation
from backends.hf.loading.loader import ModelLoadError
from backends.openai_proxy import rerank as relay
from backends.openai_proxy import tokenize as relay_tokens
from backends.process import protocol as p
from backends.scoring import ScoreRequest, ScoreResult
from backends.tokenizing import DetokenizeRequest, TokenizeRequest
from gateway.api.base import parse_wire
from gateway.api.rerank import (
    MAX_DOCUMENTS,
    RerankWire,
    ScoreWire,
    rerank_body,
    rerank_request,
    score_request,
)
from gateway.api.tokenize import (
    DetokenizeWire,
    TokenizeWire,
    detokenize_request,
    tokenize_request,
)


def rerank(**fields: Any) -> ScoreRequest:
    body = {"model": "m", "query": "q", "documents": ["a", "b"], **fields}
    return rerank_request(parse_wire(RerankWire, body), "id", 1.0)


def score(**fields: Any) -> ScoreRequest:
    body = {"model": "m", "text_1": "a", "text_2": ["b"], **fields}
    return score_request(parse_wire(ScoreWire, body), "id", 1.0)


def refused(call: Any, **fields: Any) -> str | None:
    with pytest.raises(InvalidRequest) as caught:
        call(**fields)
    return caught.value.param


def test_rerank_reads_strings_and_objects() -> None:
    request = rerank(documents=["a", {"text": "b", "title": "t"}])
    assert request.text_1 == ("q",) and request.text_2 == ("a", "b") and request.rerank
    assert request.pairs == (("q", "a"), ("q", "b"))
    assert refused(rerank, documents=[]) == "documents"
    assert refused(rerank, documents=["a", ""]) == "documents[1]"
    assert refused(rerank, documents=["a"] * (MAX_DOCUMENTS + 1)) == "documents"
    assert refused(rerank, documents=[{"content": [{"type": "text", "text": "a"}]}]) == (
        "documents[0]"
    )
    assert refused(rerank, query="") == "query"
    assert refused(rerank, top_n=-1) == "top_n"


def test_score_modes_and_lengths() -> None:
    assert score().pairs == (("a", "b"),)
    assert score(text_2=["b", "c"]).pairs == (("a", "b"), ("a", "c"))
    assert score(text_1=["a"], text_2=["b", "c"]).pairs == (("a", "b"), ("a", "c"))
    assert score(text_1=["a", "x"], text_2=["b", "c"]).pairs == (("a", "b"), ("x", "c"))
    assert score(text_2="b").text_2 == ("b",) and not score().rerank
    assert refused(score, text_1=["a", "x"], text_2=["b", "c", "d"]) == "text_1"
    assert refused(score, text_1=["a", "x"], text_2="b") == "text_1"  # many against one
    assert refused(score, text_1=[]) == "text_1"
    assert refused(score, text_2="") == "text_2"
    assert refused(score, text_2=["b", ""]) == "text_2[1]"


def test_rerank_body_sorts_cuts_and_leaves_documents_out() -> None:
    request = rerank(documents=["a", "b", "c", "d"])
    result = ScoreResult((0.2, 0.9, 0.2, 0.5), 11)
    body = rerank_body(result, request, model="m", top_n=0, documents=True)
    assert [r["index"] for r in body["results"]] == [1, 3, 0, 2]  # ties keep input order
    assert body["results"][0] == {"index": 1, "relevance_score": 0.9, "document": {"text": "b"}}
    assert body["usage"] == {"prompt_tokens": 11, "total_tokens": 11}
    cut = rerank_body(result, request, model="m", top_n=2, documents=False)
    assert cut["results"] == [
        {"index": 1, "relevance_score": 0.9},
        {"index": 3, "relevance_score": 0.5},
    ]


def test_cosines_pair_one_query_with_all_or_pairwise() -> None:
    vectors = ((1.0, 0.0), (2.0, 0.0), (0.0, 3.0), (1.0, 1.0))
    one = cosines(vectors, 1)
    assert one[0] == pytest.approx(1.0) and one[1] == pytest.approx(0.0)
    assert one[2] == pytest.approx(1 / math.sqrt(2))
    pairwise = cosines(vectors, 2)  # (1,0)·(0,3), (2,0)·(1,1)
    assert pairwise == pytest.approx((0.0, 1 / math.sqrt(2)))


def test_cross_encoder_activation_where_sentence_transformers_looks(tmp_path: Path) -> None:
    identity = "torch.nn.modules.linear.Identity"
    assert activation(tmp_path, {}) == "sigmoid"
    assert activation(tmp_path, {"sentence_transformers": {"activation_fn": identity}}) == (
        "identity"
    )
    assert activation(tmp_path, {"sbert_ce_default_activation_function": identity}) == "identity"
    # Not under torch: untrusted, so the default (sentence-transformers warns and does so).
    assert activation(tmp_path, {"sbert_ce_default_activation_function": "my.Act"}) == "sigmoid"
    st_file = tmp_path / "config_sentence_transformers.json"
    st_file.write_text(json.dumps({"activation_fn": "torch.nn.modules.activation.Tanh"}))
    assert activation(tmp_path, {"sentence_transformers": {"activation_fn": identity}}) == "tanh"
    st_file.write_text(json.dumps({"activation_fn": "torch.nn.modules.activation.GELU"}))
    with pytest.raises(ModelLoadError):
        activation(tmp_path, {})


def test_relay_bodies_and_answers() -> None:
    reranked = ScoreRequest("r", "m", ("q",), ("a", "b"), rerank=True)
    path, body = relay.score_body(reranked, "up")
    assert path == "/rerank"
    assert json.loads(body) == {"model": "up", "query": "q", "documents": ["a", "b"]}
    path, body = relay.score_body(ScoreRequest("s", "m", ("x", "y"), ("a", "b")), "up")
    assert path == "/score" and json.loads(body)["text_1"] == ["x", "y"]
    answer = {
        "results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}],
        "usage": {"total_tokens": 5},
    }
    assert relay.parse_scores(answer, "/rerank", 2) == ((0.1, 0.9), 5)
    scored = {"data": [{"index": 0, "score": 0.3}]}
    assert relay.parse_scores(scored, "/score", 1) == ((0.3,), None)
    for bad in ({"data": [{"index": 0, "score": 0.3}]}, {"data": "x"}, {"results": []}):
        with pytest.raises(UpstreamBadResponse):
            relay.parse_scores(bad, "/score", 2)
    twice = {"data": [{"index": 0, "score": 1}, {"index": 0, "score": 2}]}
    with pytest.raises(UpstreamBadResponse):
        relay.parse_scores(twice, "/score", 2)


def test_relay_tokenize_bodies_and_answers() -> None:
    tool = ToolSpec("f", "a tool", {"type": "object", "properties": {}})
    chat = TokenizeRequest(
        "t", "m", messages=(ChatMessage("user", "hi"),), tools=(tool,), add_special_tokens=False
    )
    body = json.loads(relay_tokens.tokenize_body(chat, "up"))
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["tools"][0]["function"]["name"] == "f"
    assert body["add_generation_prompt"] is True and body["continue_final_message"] is False
    assert "prompt" not in body
    prompt = json.loads(relay_tokens.tokenize_body(TokenizeRequest("t", "m", prompt="x"), "up"))
    assert prompt["prompt"] == "x" and "messages" not in prompt
    assert json.loads(relay_tokens.detokenize_body(DetokenizeRequest("d", "m", (1, 2)), "up")) == {
        "model": "up",
        "tokens": [1, 2],
    }
    parsed = relay_tokens.parse_tokenize({"tokens": [3, 4], "max_model_len": 9}, None)
    assert parsed.tokens == (3, 4) and parsed.max_model_len == 9 and parsed.token_strs is None
    assert relay_tokens.parse_tokenize({"tokens": [1]}, 7).max_model_len == 7
    with pytest.raises(UpstreamBadResponse):
        relay_tokens.parse_tokenize({"tokens": ["x"]}, None)
    assert relay_tokens.parse_detokenize({"prompt": "hi"}) == "hi"
    with pytest.raises(UpstreamBadResponse):
        relay_tokens.parse_detokenize({"text": "hi"})


def tokenized(**fields: Any) -> TokenizeRequest:
    return tokenize_request(parse_wire(TokenizeWire, {"model": "m", **fields}), "t", 1.0)


def test_tokenize_edge_defaults_as_vllm() -> None:
    prompt = tokenized(prompt="x")
    assert prompt.prompt == "x" and prompt.add_special_tokens and not prompt.messages
    assert not tokenized(prompt="x", add_special_tokens=False).add_special_tokens
    chat = tokenized(messages=[{"role": "user", "content": "hi"}])
    assert chat.messages == (ChatMessage("user", "hi"),)
    assert not chat.add_special_tokens and chat.add_generation_prompt
    prefill = tokenized(
        messages=[{"role": "assistant", "content": "It"}], continue_final_message=True
    )
    assert prefill.continue_final_message and not prefill.add_generation_prompt
    assert refused(tokenized) == "prompt"
    assert refused(tokenized, prompt="x", messages=[{"role": "user", "content": "a"}]) == "prompt"
    both = {"add_generation_prompt": True, "continue_final_message": True}
    assert refused(tokenized, messages=[{"role": "user", "content": "a"}], **both) == (
        "continue_final_message"
    )
    assert detokenize_request(parse_wire(DetokenizeWire, {"model": "m", "tokens": [0]}), "d") == (
        DetokenizeRequest("d", "m", (0,))
    )
    for bad in (-1, 2**31):
        with pytest.raises(InvalidRequest) as caught:
            parse_wire(DetokenizeWire, {"model": "m", "tokens": [0, bad]})
        assert caught.value.param == "tokens[1]"


def test_whole_calls_cross_the_worker_wire() -> None:
    request = ScoreRequest("s", "m", ("q",), ("a",), rerank=True)
    frame = p.encode_frame([(p.ASK, 1, "score", request)])
    assert pickle.loads(frame[4:]) == [(p.ASK, 1, "score", request)]
    assert {"embed", "score", "tokenize", "detokenize"} == p.ASKS
