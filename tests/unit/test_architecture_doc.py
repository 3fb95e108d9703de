"""docs/architecture.md names every gateway sub-package and every file its picture of
the request path points at exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/architecture.md").read_text()


def test_every_gateway_subpackage_is_named() -> None:
    packages = sorted(p.name for p in (ROOT / "gateway").iterdir() if (p / "__init__.py").is_file())
    assert packages  # the walk found the tree
    missing = [name for name in packages if f"`gateway/{name}/`" not in DOC]
    assert missing == []


def test_every_gateway_path_it_names_exists() -> None:
    named = set(re.findall(r"gateway/[\w/]+(?:\.py|/)", DOC))
    assert named
    assert sorted(p for p in named if not (ROOT / p).exists()) == []


def test_the_benchmarks_table_points_only_at_kept_folders() -> None:
    """docs/benchmarks/ holds one folder per suite, each in the README's table, and the
    table names no folder that is not there."""
    bench = ROOT / "docs/benchmarks"
    table = re.findall(r"^\| `([\w./-]+)/` \|", (bench / "README.md").read_text(), re.M)
    folders = sorted(p.name for p in bench.iterdir() if p.is_dir())
    assert sorted(name for name in table if "/" not in name) == folders
    assert all((bench / name).is_dir() for name in table)
