"""docs/cli.md is the ``llmso`` parsers' own reference: generated, complete, and current."""

from __future__ import annotations

import re

from tests.tools import cli_reference


def test_the_committed_reference_is_what_the_parsers_print() -> None:
    # On failure: `python -m tests.tools.cli_reference --write` and commit docs/cli.md.
    assert cli_reference.DOC.read_text() == cli_reference.render()


def test_every_subcommand_and_flag_is_there() -> None:
    text = cli_reference.render()
    headings = set(re.findall(r"^#+ `(llmso[^`]*)`", text, re.MULTILINE))
    assert {
        "llmso serve",
        "llmso prepare-model",
        "llmso bench run",
        "llmso bench compare",
        "llmso bench suite",
        "llmso plan",
    } <= headings
    assert "| `--config` |" in text and "| `--validate` |" in text and "| `--rounds` |" in text


def test_every_flag_says_what_it_does() -> None:
    rows = [line for line in cli_reference.render().splitlines() if line.startswith("| `-")]
    assert len(rows) > 40
    assert [row for row in rows if row.rstrip().endswith("|  |")] == []
