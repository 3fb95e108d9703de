"""The CLI reference (docs/cli.md), written from the ``llmso`` command's own parsers.

``python -m tests.tools.cli_reference`` prints it; ``--write`` rewrites docs/cli.md;
``tests/unit/test_cli_reference.py`` holds the committed file equal to what this prints,
so a flag added, renamed or re-described without the doc fails the suite.

The parsers: ``gateway.cli``'s (``serve``, ``prepare-model``) and one per subcommand
pyproject.toml plugs in through the ``llmso.commands`` entry-point group (``bench``,
``plan``), each module's ``_parser()``. It lives under ``tests/`` because it imports both
the product and ``bench``, which the product never does.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Iterator
from importlib import import_module
from importlib.metadata import EntryPoint
from pathlib import Path

from gateway import cli

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "cli.md"
WIDTH = 100  # usage lines wrap here, whatever the terminal
HEADER = """# CLI reference

Every subcommand and flag of `llmso`, generated from its argparse parsers
(`python -m tests.tools.cli_reference --write`; `tests/unit/test_cli_reference.py` fails
when this file and the parsers differ). `llmso serve` and `llmso prepare-model` are the
gateway's own (`gateway/cli.py`); `llmso bench` and `llmso plan` come from `bench/`, plugged
in through the `llmso.commands` entry points in `pyproject.toml` (`python -m bench ...` is
the same as `llmso bench ...`). Environment settings (`LLMSO_*`) and the config file:
[configuration.md](configuration.md).
"""


def plugins() -> dict[str, EntryPoint]:
    """The ``llmso.commands`` entry points as pyproject.toml declares them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    table = project["project"]["entry-points"][cli.PLUGINS]
    return {name: EntryPoint(name, value, cli.PLUGINS) for name, value in table.items()}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings)
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    return names


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return " \\| ".join(f"`{choice}`" for choice in action.choices)
    metavar = action.metavar or action.dest.upper()
    many = {"+": " ...", "*": " ..."}.get(str(action.nargs), "")
    return f"`{metavar}{many}`"


def _default(action: argparse.Action) -> str:
    default = action.default
    if action.required:
        return "required"
    if isinstance(action, argparse.BooleanOptionalAction):
        return "on" if default else "off"
    if action.nargs == 0 or default is None or default == () or default is argparse.SUPPRESS:
        return "—"
    if isinstance(default, Path):
        return "the current folder" if default == Path.cwd() else f"`{default}`"
    return f"`{default}`"


def _rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        text = " ".join((action.help or "").split()).replace("|", "\\|")
        yield f"| {_flag(action)} | {_value(action)} | {_default(action)} | {text} |"


def _listing(parser: argparse.ArgumentParser) -> Iterator[str]:
    """The subcommands of ``parser`` with their one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield "| subcommand | what it does |"
            yield "|---|---|"
            for choice in action._choices_actions:
                yield f"| `{choice.dest}` | {' '.join((choice.help or '').split())} |"
            yield ""


def _section(prog: str, parser: argparse.ArgumentParser, level: int) -> Iterator[str]:
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=WIDTH)
    yield f"{'#' * level} `{prog}`"
    yield ""
    if parser.description:
        yield " ".join(parser.description.split()).replace("``", "`")
        yield ""
    yield "```text"
    yield parser.format_usage().strip()
    yield "```"
    yield ""
    rows = list(_rows(parser))
    if rows:
        yield "| flag | value | default | description |"
        yield "|---|---|---|---|"
        yield from rows
        yield ""
    yield from _listing(parser)
    for name, sub in _subcommands(parser).items():
        if not list(_rows(sub)) and not _subcommands(sub) and sub.description is None:
            continue  # a plugin's placeholder: its own section follows
        yield from _section(f"{prog} {name}", sub, level + 1)


def render() -> str:
    """The whole reference, as docs/cli.md holds it."""
    found = plugins()
    lines = [HEADER]
    lines.extend(_section("llmso", cli._parser(found), 2))
    for name, entry in sorted(found.items()):
        module = import_module(entry.module)
        lines.extend(_section(f"llmso {name}", module._parser(), 2))
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
