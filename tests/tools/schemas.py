"""Validate our responses against the official OpenAI schemas kept in tests/data."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

REPO = Path(__file__).resolve().parents[2]


def schema_file() -> Path:
    explicit = os.environ.get("LLMSO_OPENAI_SCHEMAS")
    if explicit:
        return Path(explicit)
    return REPO / "tests" / "data" / "openai-schemas" / "schemas.json"


@functools.cache
def _defs() -> dict[str, Any]:
    defs: dict[str, Any] = json.loads(schema_file().read_text())["$defs"]
    return defs


@functools.cache
def _validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({"$defs": _defs(), "$ref": f"#/$defs/{name}"})


def validate(name: str, payload: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``payload`` matches schema ``name``."""
    if name == "CreateCompletionResponse" and payload.get("choices"):
        # Known spec quirk (see the schemas README): the legacy completions stream reuses
        # this schema but every intermediate chunk carries null finish_reason and usage.
        payload = _completion_chunk_as_final(payload)
    _validator(name).validate(payload)


def _completion_chunk_as_final(payload: dict[str, Any]) -> dict[str, Any]:
    choices = [
        {**choice, "finish_reason": choice.get("finish_reason") or "stop"}
        for choice in payload["choices"]
    ]
    fixed = {**payload, "choices": choices}
    if fixed.get("usage", 0) is None:
        fixed.pop("usage")
    return fixed
