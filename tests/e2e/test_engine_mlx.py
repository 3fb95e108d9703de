"""mlx-lm's server behind ``llmso serve`` (backend: openai, engine: mlx): the SDK suite
with few tokens (mlx on CPU is slow). Exercises the mlx quirks: the served folder path
as upstream model id, ``HF_HUB_CACHE``, ``: keepalive`` comments while it prefills, and
its ``object: chat.completion`` usage chunk.

Needs ``make mlx``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.contract.sdk_suite import EngineSuite
from tests.tools.engines import (
    model_folder,
    proxy_config,
    require_engine,
    start_mlx,
)
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("mlx"), pytest.mark.slow]

MODEL = "smollm2-mlx"


@pytest.fixture(scope="module")
def engine() -> Iterator[RunningServer]:
    require_engine("mlx")
    with start_mlx() as running:
        yield running


@pytest.fixture(scope="module")
def server(engine: RunningServer) -> Iterator[RunningServer]:
    config = proxy_config(MODEL, engine, "mlx", model_folder(), first_token_timeout=300.0)
    with gateway(config) as running:
        yield running


class TestMLX(EngineSuite):
    model_name = MODEL
    client_timeout = 600.0
    max_tokens = 4
    rejected_snippet = "top_logprobs"

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        # The gateway allows up to 20 alternatives; mlx-lm allows 11 and answers 400.
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=1,
            logprobs=True,
            top_logprobs=15,
        )
