"""The example configs for engine servers load and describe an ``openai`` model."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.loader import load_config
from config.schema import OpenAIModelConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"


@pytest.mark.parametrize("engine", ["vllm", "llamacpp", "mlx"])
def test_engine_example_loads(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSO_MLX_MODEL_PATH", "/models/smollm2")
    config = load_config(EXAMPLES / f"{engine}.yaml")
    (model,) = config.models
    assert isinstance(model, OpenAIModelConfig)
    assert model.engine == engine
    assert model.base_url.endswith("/v1") and model.upstream_model
    if engine == "mlx":
        assert model.upstream_model == "/models/smollm2"
