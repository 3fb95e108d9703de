"""The engine SDK suite through ``llmso serve`` against the fake upstream (always runs):
proves the suite itself and the gateway wiring without a real engine."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.contract.sdk_suite import EngineSuite
from tests.tools.engines import proxy_config, start_fake_upstream
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "fake-proxy"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with (
        start_fake_upstream("--chunks", "6", "--model", "up-model") as upstream,
        gateway(proxy_config(MODEL, upstream, "generic", "up-model")) as running,
    ):
        yield running


class TestFakeEngine(EngineSuite):
    model_name = MODEL
    max_tokens = 4

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        # Longer than the fake's 2048-token window; the gateway knows no limit and passes it.
        prompt = "word " * 2100
        return client.completions.create(model=model, prompt=prompt, max_tokens=2)

    def test_hop_metrics_and_server_timing(self, server: RunningServer, model: str) -> None:
        response = httpx.post(
            server.url + "/v1/completions",
            json={"model": model, "prompt": "hi", "max_tokens": 2},
            timeout=30,
        )
        assert response.status_code == 200
        assert "upstream;dur=" in response.headers.get("server-timing", "")
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        assert f'llmso_upstream_up{{backend="openai",model="{model}"}} 1.0' in metrics
        assert 'llmso_upstream_requests_total{backend="openai"' in metrics
