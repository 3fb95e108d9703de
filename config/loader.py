"""Read a YAML file into an ``AppConfig``; every failure becomes one ``ConfigError``.

Strings may name environment variables as ``${NAME}``; a variable that is not set is an
error naming it, never a literal sent on. There is no default syntax, and a bare
``$NAME`` is kept as written.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import ValidationError

from config.schema import AppConfig

DEFAULT_CONFIG = Path(__file__).with_name("default.yaml")

log = logging.getLogger("llmso.config")

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigError(Exception):
    """A config file that cannot be used; one line per fault, each naming the file, the
    place (line and column, or field path) and the reason."""


def load_config(path: Path | str) -> AppConfig:
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping with 'models'")
    expanded = _expand_env(raw, path, ())
    assert isinstance(expanded, dict)
    try:
        config = AppConfig.model_validate({**expanded, "source_path": path})
    except ValidationError as exc:
        raise ConfigError("\n".join(_field_faults(path, exc))) from exc
    _warn_deprecated(path, raw)
    return config


def _read_yaml(path: Path) -> object:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(_yaml_fault(path, exc)) from exc


def _yaml_fault(path: Path, exc: yaml.YAMLError) -> str:
    """``FILE:LINE:COLUMN: not valid YAML: REASON`` on one line (1-based, as editors count)."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"{path}: not valid YAML: {_one_line(str(exc))}"
    mark = exc.problem_mark
    reason = exc.problem or "syntax error"
    if exc.context:
        reason += f" ({exc.context}"
        if exc.context_mark is not None and exc.context_mark.line != mark.line:
            reason += f" started at line {exc.context_mark.line + 1}"
        reason += ")"
    return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {_one_line(reason)}"


def _field_faults(path: Path, exc: ValidationError) -> list[str]:
    """One ``FILE: FIELD.PATH: REASON`` line per field pydantic refused.

    A field typed as a union fails once per member (``literal['a','b']``, ``literal['auto']``):
    those members' tags are dropped from the path and their reasons joined on one line.
    """
    faults: dict[str, list[str]] = {}
    for error in exc.errors():
        parts = [str(part) for part in error["loc"] if "[" not in str(part)]
        where = ".".join(parts) or "(top level)"
        reason = _one_line(error["msg"].removeprefix("Value error, "))
        if reason not in faults.setdefault(where, []):
            faults[where].append(reason)
    return [f"{path}: {where}: {'; or: '.join(reasons)}" for where, reasons in faults.items()]


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _expand_env(value: object, path: Path, where: tuple[str, ...]) -> object:
    """Replace each ``${NAME}`` in strings with that environment variable (secrets and
    ports come from the environment); ``where`` is the field path, for the error."""
    if isinstance(value, str):
        return _REFERENCE.sub(lambda match: _variable(match, path, where), value)
    if isinstance(value, dict):
        return {key: _expand_env(item, path, (*where, str(key))) for key, item in value.items()}
    if isinstance(value, list):
        return [_expand_env(item, path, (*where, str(i))) for i, item in enumerate(value)]
    return value


def _variable(match: re.Match[str], path: Path, where: tuple[str, ...]) -> str:
    name = match.group(1)
    field = ".".join(where) or "(top level)"
    if not _ENV_NAME.match(name):
        raise ConfigError(
            f"{path}: {field}: {match.group(0)!r} is not an environment variable reference "
            "(write ${NAME}; there is no default syntax)"
        )
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"{path}: {field}: environment variable {name} is not set")
    return value


def _warn_deprecated(path: Path, raw: Mapping[str, object]) -> None:
    server = raw.get("server")
    if isinstance(server, Mapping) and "log_prompts" in server:
        log.warning(
            "%s: server.log_prompts is deprecated and ignored: request logs never hold "
            "prompt or answer text (tracing.capture_content records prompts on spans)",
            path,
        )
