"""docs/config.md is the schema's own reference: generated, complete, and current."""

from __future__ import annotations

from config import reference


def test_the_committed_reference_is_what_the_schema_prints() -> None:
    # On failure: `python -m config.reference --write` and commit docs/config.md.
    assert reference.DOC.read_text() == reference.render()


def test_every_key_has_a_description() -> None:
    rows = [line for line in reference.render().splitlines() if line.startswith("| `")]
    assert len(rows) > 100
    undescribed = [row for row in rows if row.rstrip().endswith("|  |")]
    assert undescribed == []
