"""The config reference (docs/config.md), written from the schema's own field descriptions.

``python -m config.reference`` prints it; ``--write`` rewrites docs/config.md. A unit test
holds the committed file equal to what this prints, so a key added to the schema without a
description, or a description changed without the reference, fails the suite.

Each section is one pydantic model: a row per field with its YAML path, type, default and
description. A field whose type is another model of the schema gets a section of its own.
The ``models:`` list is a union on ``backend``: one section per backend.
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from config.schema import AppConfig, HFModelConfig, OpenAIModelConfig, TritonModelConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
BACKENDS: tuple[tuple[str, type[BaseModel]], ...] = (
    ("hf", HFModelConfig),
    ("openai", OpenAIModelConfig),
    ("triton", TritonModelConfig),
)
HEADER = """# Config reference

Every key of an llmso config file, generated from the schema's descriptions
(`python -m config.reference --write`; `tests/unit/test_config_reference.py` fails when this
file and the schema differ). How the file is read (`${VAR}` substitution, one-line errors,
hot reload) and the environment settings are in [configuration.md](configuration.md); worked
examples are in `config/examples/`.

`models:` is a list; each entry's `backend:` picks its section below. A key written
`a.b` is nested: `b:` inside `a:`. A type `X | None` may be left out or set to `null`.
"""


def _type_name(annotation: Any) -> str:
    """A short, readable name for a field's type."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is Literal:
        return " \\| ".join(repr(a) if not isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (tuple, list):
        inner = _type_name(args[0]) if args else "any"
        return f"list of {inner}"
    if origin is dict:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    if isinstance(annotation, type):
        return annotation.__name__ if not issubclass(annotation, BaseModel) else "mapping"
    return str(annotation).replace("typing.", "")


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "see below"
    else:
        value = info.default
    if value is None or value is PydanticUndefined:
        return "—"
    if isinstance(value, tuple | list) and not value:
        return "`[]`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    """The schema models a field's type refers to (through unions, tuples, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _models_in(arg)


def _rows(model: type[BaseModel]) -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        if info.exclude:
            continue  # set by the loader, never written in a file
        text = " ".join((info.description or "").split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {_type_name(info.annotation)} | {_default(info)} | {text} |")
    return rows


def _section(title: str, model: type[BaseModel], seen: set[str]) -> Iterator[str]:
    seen.add(title)
    yield f"## `{title}`"
    yield ""
    doc = " ".join((model.__doc__ or "").split())
    if doc and not doc.startswith(model.__name__ + "("):
        yield doc.replace("``", "`")
        yield ""
    yield "| key | type | default | description |"
    yield "|---|---|---|---|"
    yield from _rows(model)
    yield ""
    for name, info in model.model_fields.items():
        for sub in _models_in(info.annotation):
            if sub in (HFModelConfig, OpenAIModelConfig, TritonModelConfig):
                continue
            path = f"{title}.{name}" if title else name
            if path not in seen:
                yield from _section(path, sub, seen)


def render() -> str:
    """The whole reference, as docs/config.md holds it."""
    lines = [HEADER]
    seen: set[str] = set()
    for name, info in AppConfig.model_fields.items():
        if name == "models" or info.exclude:
            continue
        for sub in _models_in(info.annotation):
            lines.extend(_section(name, sub, seen))
    for backend, model in BACKENDS:
        lines.extend(_section(f"models[] with backend: {backend}", model, seen))
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC}")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        DOC.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
