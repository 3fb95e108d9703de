"""The built-in suites produce valid specs whose generated gateway configs the gateway accepts."""

from __future__ import annotations

from pathlib import Path

import yaml

from bench.spec import CompareSpec, fill
from bench.suites import HF_MODES, models_suite, overhead_suite
from config.schema import AppConfig, HFModelConfig, OpenAIModelConfig

ROOT = Path(__file__).resolve().parents[2]
VALUES = {"port": "18000", "port_fake": "18001", "workdir": "/tmp/w"}


def _configs(spec: CompareSpec) -> dict[str, AppConfig]:
    out = {}
    for system in spec.systems:
        for content in system.files.values():
            out[system.label] = AppConfig.model_validate(yaml.safe_load(fill(content, VALUES)))
    return out


def test_models_suite_covers_every_system_with_one_budget() -> None:
    spec = models_suite(ROOT, "/models/smol", quick=False)
    labels = [s.label for s in spec.systems]
    assert labels == [
        *(f"llmso-hf-{m}" for m in HF_MODES),
        "vllm-cpu",
        "transformers-generate",
    ]
    assert spec.concurrency == (1, 4, 16) and spec.max_tokens == 64 and spec.ignore_eos
    assert spec.requests_for(16) == 32 and spec.temperature == 0.0
    configs = _configs(spec)
    for mode in HF_MODES:
        model = configs[f"llmso-hf-{mode}"].models[0]
        assert isinstance(model, HFModelConfig)
        assert model.scheduling == mode and model.dtype == "bfloat16"
        assert configs[f"llmso-hf-{mode}"].server.port == 18000
    vllm = next(s for s in spec.systems if s.label == "vllm-cpu")
    assert "/models/smol" in vllm.command and "--enforce-eager" in vllm.command
    assert vllm.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    ref = next(s for s in spec.systems if s.label == "transformers-generate")
    assert ref.kind == "reference" and "{out}" in ref.command
    quick = models_suite(ROOT, "/m", quick=True, include_vllm=False)
    assert quick.concurrency == (1, 2) and quick.max_tokens == 8 and quick.min_requests == 4
    assert "vllm-cpu" not in [s.label for s in quick.systems]


def test_overhead_suite_points_the_gateway_at_the_fake() -> None:
    spec = overhead_suite(ROOT)
    assert spec.baseline == "direct" and spec.streams == (True, False)
    assert spec.concurrency == (1, 16, 64)
    assert spec.services[0].name == "fake" and "bench.fake_upstream" in spec.services[0].command
    model = _configs(spec)["gateway"].models[0]
    assert isinstance(model, OpenAIModelConfig)
    assert model.base_url == "http://127.0.0.1:18001/v1" and model.name == spec.model


def test_overhead_suite_has_a_traced_gateway() -> None:
    configs = _configs(overhead_suite(ROOT))
    assert not configs["gateway"].tracing.enabled
    traced = configs["gateway-traced"].tracing
    assert traced.otlp_endpoint == "http://127.0.0.1:18001" and traced.sample_ratio == 1.0
