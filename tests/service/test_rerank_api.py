"""Service tier for /v1/rerank, /rerank, /v2/rerank, /v1/score, /score, /tokenize and
/detokenize: the app in-process over ASGI with a scripted scorer beside a scripted chat
model; shapes, orderings, refusals (each naming its param), metrics and the request log."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from backends.base import (
    Backend,
    BackendEvent,
    Feature,
    GenerationRequest,
    InvalidRequest,
    ModelInfo,
)
from backends.scoring import ScoreRequest, ScoreResult
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult
from config.schema import AppConfig, ModelConfig
from gateway.app import build_app
from gateway.observe.logs import REQUEST_LOGGER
from tests.service.test_gateway_api import ScriptedBackend, assert_error

RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


def overlap(a: str, b: str) -> float:
    """The share of ``b``'s words found in ``a``: a score whose order a test can predict."""
    words = b.split()
    return sum(word in a.split() for word in words) / len(words)


class ScriptedScorer:
    """Scores by word overlap, tokenizes one id per character (its code point), and
    refuses a document ``refuse`` as a backend would (naming ``text_2[i]``)."""

    def __init__(self, config: ModelConfig) -> None:
        self.scored: list[ScoreRequest] = []
        self.tokenized: list[TokenizeRequest] = []

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def ready(self) -> bool:
        return True

    def info(self) -> ModelInfo:
        return ModelInfo(max_context=512, features=frozenset({Feature.SCORE, Feature.TOKENIZE}))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[BackendEvent]:
        raise AssertionError("the gateway must not send generation to a scorer")
        yield  # pragma: no cover

    async def score(self, request: ScoreRequest) -> ScoreResult:
        self.scored.append(request)
        if "refuse" in request.text_2:
            index = request.text_2.index("refuse")
            raise InvalidRequest("refused", param=f"text_2[{index}]")
        scores = tuple(overlap(a, b) for a, b in request.pairs)
        tokens = sum(len(t.split()) for t in request.text_1 + request.text_2)
        return ScoreResult(scores, tokens, queued_at=1.0, started_at=1.5)

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        self.tokenized.append(request)
        text = request.prompt or "|".join(m.content for m in request.messages)
        ids = tuple(ord(c) for c in text) + ((1,) if request.add_special_tokens else ())
        strs = tuple(chr(i) for i in ids) if request.return_token_strs else None
        return TokenizeResult(ids, 512, strs)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        return "".join(chr(t) for t in request.tokens)


@pytest.fixture
async def app_and_scorer() -> AsyncIterator[tuple[httpx.AsyncClient, ScriptedScorer]]:
    config = AppConfig.model_validate(
        {
            "models": [
                {"name": "scorer", "aliases": ["s"], "backend": "openai", "base_url": "http://x"},
                {"name": "chatter", "backend": "openai", "base_url": "http://x"},
            ]
        }
    )
    scorer = ScriptedScorer(config.models[0])

    def factory(model: ModelConfig, _on_crash: Any) -> Backend:
        if model.name == "scorer":
            return scorer  # type: ignore[return-value]
        return ScriptedBackend(model)

    app = build_app(config, backend_factory=factory)
    async with (
        app.lifespan(),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        yield client, scorer


@pytest.fixture
def client(app_and_scorer: tuple[httpx.AsyncClient, ScriptedScorer]) -> httpx.AsyncClient:
    return app_and_scorer[0]


DOCS = ["paris is big", "the capital of france is paris", "berlin"]


async def test_rerank_sorts_best_first_on_every_path(client: httpx.AsyncClient) -> None:
    query = "what is the capital of france paris"
    want = sorted(range(3), key=lambda i: overlap(query, DOCS[i]), reverse=True)
    for path in RERANK_PATHS:
        response = await client.post(path, json={"model": "s", "query": query, "documents": DOCS})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == "scorer" and body["id"].startswith("rerank-")
        assert [r["index"] for r in body["results"]] == want
        for result in body["results"]:
            assert result["relevance_score"] == overlap(query, DOCS[result["index"]])
            assert result["document"] == {"text": DOCS[result["index"]]}
        words = len(query.split()) + sum(len(d.split()) for d in DOCS)
        assert body["usage"] == {"prompt_tokens": words, "total_tokens": words}


async def test_rerank_top_n_objects_and_no_documents(
    app_and_scorer: tuple[httpx.AsyncClient, ScriptedScorer],
) -> None:
    client, scorer = app_and_scorer
    documents = [{"text": d, "title": "ignored"} for d in DOCS]
    body = {"model": "s", "query": "paris", "documents": documents, "top_n": 2}
    response = await client.post("/v1/rerank", json={**body, "return_documents": False})
    results = response.json()["results"]
    assert len(results) == 2 and all("document" not in r for r in results)
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert scorer.scored[-1].text_2 == tuple(DOCS) and scorer.scored[-1].rerank
    # top_n 0 (vLLM's "all") and one beyond the documents both answer every document.
    for top_n in (0, 10):
        everything = await client.post("/v1/rerank", json={**body, "top_n": top_n})
        assert len(everything.json()["results"]) == 3


async def test_score_one_to_one_one_to_many_many_to_many(
    app_and_scorer: tuple[httpx.AsyncClient, ScriptedScorer],
) -> None:
    client, scorer = app_and_scorer
    cases: list[tuple[Any, Any, list[tuple[str, str]]]] = [
        ("a b", "b", [("a b", "b")]),
        ("a b", ["a", "c", "b c"], [("a b", "a"), ("a b", "c"), ("a b", "b c")]),
        (["a b"], ["a", "c"], [("a b", "a"), ("a b", "c")]),
        (["a", "c"], ["a", "a"], [("a", "a"), ("c", "a")]),
    ]
    for path in ("/v1/score", "/score"):
        for text_1, text_2, pairs in cases:
            response = await client.post(
                path, json={"model": "scorer", "text_1": text_1, "text_2": text_2}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["object"] == "list" and body["model"] == "scorer"
            assert isinstance(body["created"], int) and body["id"].startswith("score-")
            assert [d["index"] for d in body["data"]] == list(range(len(pairs)))
            assert all(d["object"] == "score" for d in body["data"])
            assert [d["score"] for d in body["data"]] == [overlap(a, b) for a, b in pairs]
            assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] > 0
            assert not scorer.scored[-1].rerank


async def test_scoring_refusals_name_the_param(client: httpx.AsyncClient) -> None:
    rerank = {"model": "s", "query": "q", "documents": ["a"]}
    for change, param in (
        ({"documents": []}, "documents"),
        ({"documents": ["a", ""]}, "documents[1]"),
        ({"documents": [3]}, "documents[0]"),
        ({"documents": ["a"] * 1001}, "documents"),
        ({"query": ""}, "query"),
        ({"top_n": -1}, "top_n"),
        ({"query": None}, "query"),
    ):
        response = await client.post("/v1/rerank", json={**rerank, **change})
        assert_error(response, 400, None, param)
    # A backend's refusal in scoring's names reads in rerank's.
    refused = await client.post("/v1/rerank", json={**rerank, "documents": ["a", "refuse"]})
    assert_error(refused, 400, None, "documents[1]")
    score = {"model": "s", "text_1": "a", "text_2": ["b"]}
    for change, param in (
        ({"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
        ({"text_1": []}, "text_1"),
        ({"text_2": ""}, "text_2"),
        ({"text_2": ["b", ""]}, "text_2[1]"),
        ({"text_2": None}, "text_2"),
    ):
        response = await client.post("/v1/score", json={**score, **change})
        assert_error(response, 400, None, param)
    for path, body in (("/v1/rerank", rerank), ("/v1/score", score)):
        chat_model = await client.post(path, json={**body, "model": "chatter"})
        assert_error(chat_model, 400, "unsupported_feature", "model")
        assert "does not serve /v1/score or /v1/rerank" in chat_model.json()["error"]["message"]
        missing = await client.post(path, json={**body, "model": "nope"})
        assert_error(missing, 404, "model_not_found", "model")
        assert (await client.get(path)).status_code == 405


async def test_tokenize_prompt_and_messages(
    app_and_scorer: tuple[httpx.AsyncClient, ScriptedScorer],
) -> None:
    client, scorer = app_and_scorer
    response = await client.post("/tokenize", json={"model": "s", "prompt": "hi"})
    assert response.json() == {
        "count": 3,
        "max_model_len": 512,
        "tokens": [ord("h"), ord("i"), 1],
        "token_strs": None,
    }
    plain = await client.post(
        "/tokenize",
        json={"model": "s", "prompt": "hi", "add_special_tokens": False, "return_token_strs": True},
    )
    assert plain.json()["tokens"] == [104, 105] and plain.json()["token_strs"] == ["h", "i"]
    messages = [{"role": "system", "content": "be"}, {"role": "user", "content": "hi"}]
    chat = await client.post("/tokenize", json={"model": "s", "messages": messages})
    assert chat.json()["count"] == len("be|hi")  # no special tokens added to a chat
    asked = scorer.tokenized[-1]
    assert [m.role for m in asked.messages] == ["system", "user"]
    assert asked.add_generation_prompt and not asked.continue_final_message
    await client.post(
        "/tokenize", json={"model": "s", "messages": messages, "continue_final_message": True}
    )
    assert scorer.tokenized[-1].continue_final_message
    assert not scorer.tokenized[-1].add_generation_prompt
    back = await client.post("/detokenize", json={"model": "s", "tokens": [104, 105]})
    assert back.json() == {"prompt": "hi"}


async def test_tokenize_refusals_name_the_param(client: httpx.AsyncClient) -> None:
    both = {"model": "s", "prompt": "a", "messages": [{"role": "user", "content": "a"}]}
    assert_error(await client.post("/tokenize", json=both), 400, None, "prompt")
    assert_error(await client.post("/tokenize", json={"model": "s"}), 400, None, "prompt")
    switches = {
        "model": "s",
        "messages": [{"role": "user", "content": "a"}],
        "add_generation_prompt": True,
        "continue_final_message": True,
    }
    response = await client.post("/tokenize", json=switches)
    assert_error(response, 400, None, "continue_final_message")
    bad_role = {"model": "s", "messages": [{"role": "wizard", "content": "a"}]}
    assert_error(await client.post("/tokenize", json=bad_role), 400, None, "messages[0].role")
    negative = {"model": "s", "tokens": [1, -2]}
    assert_error(await client.post("/detokenize", json=negative), 400, None, "tokens[1]")
    assert_error(await client.post("/tokenize", json={"prompt": "a"}), 400, None, "model")
    for path, body in (("/tokenize", {"prompt": "a"}), ("/detokenize", {"tokens": [1]})):
        chat_model = await client.post(path, json={"model": "chatter", **body})
        assert_error(chat_model, 400, "unsupported_feature", "model")
        missing = await client.post(path, json={"model": "nope", **body})
        assert_error(missing, 404, "model_not_found", "model")


async def test_metrics_and_request_log_name_the_routes(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        await client.post("/v2/rerank", json={"model": "s", "query": "a b", "documents": ["a"]})
        await client.post("/tokenize", json={"model": "s", "prompt": "x"})
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == REQUEST_LOGGER]
    rerank = next(line for line in lines if line["endpoint"] == "/v2/rerank")
    assert rerank["model"] == "scorer" and rerank["status"] == "ok"
    assert rerank["input_tokens"] == 3 and rerank["output_tokens"] == 0
    tokenize = next(line for line in lines if line["endpoint"] == "/tokenize")
    assert tokenize["input_tokens"] == 0  # no model ran
    metrics = (await client.get("/metrics")).text
    for route in ("/v2/rerank", "/tokenize"):
        assert any(
            f'endpoint="{route}"' in line and 'model="scorer"' in line and 'status="ok"' in line
            for line in metrics.splitlines()
        ), route


async def test_openapi_documents_the_routes(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    ids = [op["post"]["operationId"] for path, op in spec["paths"].items() if "post" in op]
    assert len(ids) == len(set(ids))
    for path in (*RERANK_PATHS, "/v1/score", "/score", "/tokenize", "/detokenize"):
        assert "post" in spec["paths"][path], path
    rerank = spec["components"]["schemas"]["RerankWire"]
    assert {"model", "query", "documents"} <= set(rerank["required"])
