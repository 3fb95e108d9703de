"""Read a YAML file into an ``AppConfig``; every failure becomes one ``ConfigError``."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from config.schema import AppConfig

DEFAULT_CONFIG = Path(__file__).with_name("default.yaml")


class ConfigError(Exception):
    """A config file that cannot be used; the message names file, field and reason."""


def load_config(path: Path | str) -> AppConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping with 'models'")
    expanded = _expand_env(raw)
    assert isinstance(expanded, dict)
    try:
        config = AppConfig.model_validate({**expanded, "source_path": path})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from exc
    return config


def _expand_env(value: object) -> object:
    """Expand ``${VAR}`` in strings so secrets and ports can come from the environment."""
    if isinstance(value, str):
        return os.path.expandvars(value)
    if isinstance(value, dict):
        return {key: _expand_env(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item) for item in value]
    return value
