"""A traffic split and a mirror through real ``llmso serve``, three fake upstream processes
(``bench/fake_upstream.py``) and the official ``openai`` client: a 90/10 split of 400
requests, and a shadow whose (shorter) answers reach its upstream but never the client."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.registry.split import mirrored
from tests.tools.engines import start_fake_upstream
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

SHARE = 0.25
WORDS = 6  # the targets' answers; the shadow's have 2


def model(name: str, upstream: RunningServer, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "backend": "openai",
        "base_url": upstream.url + "/v1",
        "upstream_model": "up",
        "health_interval": 1.0,
        **extra,
    }


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, RunningServer]]:
    with ExitStack() as stack:
        up = {
            name: stack.enter_context(start_fake_upstream("--chunks", chunks, "--model", "up"))
            for name, chunks in (("a", str(WORDS)), ("b", str(WORDS)), ("shadow", "2"))
        }
        mirror = {"model": "smollm-shadow", "share": SHARE}
        config = {
            "models": [
                model("smollm-a", up["a"], mirror=mirror),
                model("smollm-b", up["b"]),
                model("smollm-shadow", up["shadow"]),
            ],
            "routes": [{"name": "chat", "split": {"smollm-a": 90, "smollm-b": 10}}],
        }
        running = stack.enter_context(gateway(config))
        yield {"gateway": running, **up}


def completed(upstream: RunningServer) -> int:
    text = httpx.get(upstream.url + "/metrics", timeout=5).text
    found = re.search(r"^fake_completed (\d+)", text, re.M)
    assert found is not None, text
    return int(found.group(1))


def test_split_and_mirror(servers: dict[str, RunningServer]) -> None:
    client = openai.OpenAI(base_url=servers["gateway"].url + "/v1", api_key="none")
    served: Counter[str] = Counter()
    copied = 0
    for i in range(400):
        rid = f"e2e-{i}"
        answer = client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hello"}],
            stream=False,
            extra_headers={"x-request-id": rid},
        )
        served[answer.model] += 1
        text = answer.choices[0].message.content or ""
        assert len(text.split()) >= WORDS - 1  # never the shadow's two words
        if answer.model == "smollm-a" and mirrored(rid, SHARE):
            copied += 1  # smollm-a mirrors this request id
    assert 360 - 20 <= served["smollm-a"] <= 360 + 20
    assert served["smollm-a"] + served["smollm-b"] == 400
    assert completed(servers["a"]) == served["smollm-a"]
    assert completed(servers["b"]) == served["smollm-b"]
    # The copies reach the shadow's upstream, in the background.
    deadline = time.monotonic() + 30
    while completed(servers["shadow"]) < copied and time.monotonic() < deadline:
        time.sleep(0.1)
    assert completed(servers["shadow"]) == copied > 0
    metrics = httpx.get(servers["gateway"].url + "/metrics", timeout=5).text
    route = {"route": "chat", "target": "smollm-a"}
    assert sample(metrics, "llmso_route_requests_total", route) == served["smollm-a"]
    copies = {"model": "smollm-a", "shadow": "smollm-shadow", "outcome": "ok"}
    assert sample(metrics, "llmso_mirror_requests_total", copies) == copied


def sample(text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return found.value
    raise AssertionError(f"{name}{labels} not exported")
