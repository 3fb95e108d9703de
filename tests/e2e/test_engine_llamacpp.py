"""llama.cpp's server (llama-cpp-python) behind ``llmso serve`` (backend: openai, engine:
llamacpp): the SDK suite. llama.cpp sends no usage when streaming, so the usage checks
here exercise the proxy's own token counting.

Needs ``make llamacpp``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.contract.sdk_suite import EngineSuite
from tests.tools.engines import proxy_config, require_engine, start_llamacpp
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("llamacpp"), pytest.mark.slow]

MODEL = "smollm2-llamacpp"
N_CTX = 512


@pytest.fixture(scope="module")
def engine() -> Iterator[RunningServer]:
    require_engine("llamacpp")
    with start_llamacpp(MODEL, n_ctx=N_CTX) as running:
        yield running


@pytest.fixture(scope="module")
def server(engine: RunningServer) -> Iterator[RunningServer]:
    with gateway(proxy_config(MODEL, engine, "llamacpp", MODEL)) as running:
        yield running


class TestLlamaCpp(EngineSuite):
    model_name = MODEL
    max_tokens = 8

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        # Past llama.cpp's n_ctx; llama-cpp-python answers 400 context_length_exceeded.
        prompt = "hello " * (N_CTX + 100)
        return client.completions.create(model=model, prompt=prompt, max_tokens=4)

    def test_concurrent_streams_all_complete(self, client: openai.OpenAI, model: str) -> None:
        from concurrent.futures import ThreadPoolExecutor

        def one(i: int) -> str:
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"Count to {i + 3}."}],
                max_tokens=6,
                temperature=0,
                stream=True,
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        with ThreadPoolExecutor(3) as pool:
            texts = list(pool.map(one, range(3)))
        assert all(texts), texts  # none silently emptied (--interrupt_requests False)
