"""Two real llama.cpp servers behind one ``llmso serve``: ``prefix`` balancing keeps a
shared prompt prefix on the replica that has it cached; ``round_robin`` does not.

llama-cpp-python keeps the last prompt's KV cache and logs ``Llama.generate: N
prefix-match hit`` when a new prompt reuses N of its tokens; the sum of N over a run is
the prompt tokens the engines did not have to recompute. The same gateway serves two
models over the same two replicas, one per policy, each with its own documents.

Needs ``make llamacpp``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from backends.base import GenerationRequest, RequestKind, SamplingParams
from backends.replicas.balance import PrefixAffinity, affinity_key
from tests.tools.engines import require_engine, start_llamacpp
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("llamacpp"), pytest.mark.slow]

MODEL = "smollm2-llamacpp"
_HIT = re.compile(r"Llama\.generate: (\d+) prefix-match hit")


@pytest.fixture(scope="module")
def engines() -> Iterator[list[RunningServer]]:
    require_engine("llamacpp")
    with start_llamacpp(MODEL, n_ctx=1024) as first, start_llamacpp(MODEL, n_ctx=1024) as second:
        yield [first, second]


@pytest.fixture(scope="module")
def server(engines: list[RunningServer]) -> Iterator[RunningServer]:
    common = {
        "backend": "openai",
        "engine": "llamacpp",
        "upstream_model": MODEL,
        "replicas": [f"{engine.url}/v1" for engine in engines],
        "health_interval": 1.0,
        "first_token_timeout": 120.0,
    }
    models = [
        {"name": "rr", "balance": "round_robin", **common},
        {"name": "px", "balance": "prefix", **common},
    ]
    with gateway({"models": models}) as running:
        yield running


def _hits(engines: list[RunningServer]) -> int:
    logs = [engine.log_path.read_text(errors="replace") for engine in engines]
    return sum(int(n) for log in logs for n in _HIT.findall(log))


def _documents(engines: list[RunningServer], tag: str) -> tuple[str, str]:
    """Two long documents whose prefixes live on different replicas of the ring."""
    ring = PrefixAffinity([f"{engine.url}/v1" for engine in engines], 1.5)

    def doc(i: int) -> str:
        return f"{tag} document {i}. " + f"Facts about topic {i} and its long history. " * 7

    def home(text: str) -> int:
        request = GenerationRequest(
            "r", "px", RequestKind.COMPLETION, SamplingParams(max_tokens=1), prompt=text
        )
        return ring.primary(affinity_key(request, 256))

    first = doc(0)
    second = next(doc(i) for i in range(1, 50) if home(doc(i)) != home(first))
    return first, second


def _run(client: httpx.Client, model: str, docs: tuple[str, str]) -> None:
    a, b = docs
    for n, doc in enumerate([a, a, b, b, a, a, b, b]):
        body = {
            "model": model,
            "prompt": f"{doc}\nQuestion {n}: what is topic {n}?\nAnswer:",
            "max_tokens": 1,
            "temperature": 0,
        }
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text


def test_prefix_policy_reuses_the_engines_prompt_cache(
    server: RunningServer, engines: list[RunningServer]
) -> None:
    with httpx.Client(base_url=server.url, timeout=180) as client:
        start = _hits(engines)
        _run(client, "rr", _documents(engines, "Alpha"))
        round_robin = _hits(engines) - start
        _run(client, "px", _documents(engines, "Omega"))
        prefix = _hits(engines) - start - round_robin
        metrics = client.get("/metrics").text
    # Six of eight prompts follow one with the same ~75-token document on their replica.
    print("prompt tokens reused: prefix", prefix, "round_robin", round_robin)
    assert prefix >= 6 * 50, (prefix, round_robin)
    assert round_robin * 5 < prefix, (prefix, round_robin)
    affinity = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("llmso_replica_routes_total{") and 'model="px"' in line
        and 'reason="affinity"' in line
    ]  # fmt: skip
    assert sum(affinity) == 8
