"""The map in the README and docs/ is true: every module, file and make target they name
exists (a moved module or a renamed target fails here, not in a reader's hands)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TOP = r"(?:gateway|backends|bench|config|tests|mk|deploy|docs)"
PATH = re.compile(rf"(?<![\w./-])({TOP}/[\w./-]*[\w/])")
DOTTED = re.compile(r"(?<![\w./-])((?:gateway|backends|bench|config|tests)(?:\.[a-z_][a-z0-9_]*)+)")
MAKE = re.compile(r"`make ([a-z][\w-]*)")
# A line that names a path as history: the text says where to find it in git.
HISTORY = re.compile(r"in git at|git show|since removed|same commit")
# Paths that are not this repository's: named on purpose, with the reason.
NOT_OURS = {
    ("triton.md", "backends/python/"): "a folder inside a Triton model repository",
    ("README.md", "docs/benchmarks/NAME/results.md"): "a pattern",
    ("benchmarks/README.md", "docs/benchmarks/NAME/results.md"): "a pattern",
    ("benchmarks/README.md", "docs/benchmarks/models-gpu"): "written by `make bench-gpu`",
}


def _mentions(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        name = str(doc.relative_to(ROOT / "docs")) if doc.parent != ROOT else doc.name
        previous = ""
        for line in doc.read_text().splitlines():
            # A history note may wrap: the line before counts too.
            if HISTORY.search(previous + " " + line):
                previous = line
                continue
            previous = line
            found += [(name, m.group(1)) for m in pattern.finditer(line)]
    return found


def _module_exists(dotted: str) -> bool:
    """``a.b.c`` is a module, or a name inside one (one attribute deep)."""
    parts = dotted.split(".")
    for keep in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:keep])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return True
    return False


def test_every_named_path_exists() -> None:
    missing = [
        f"{doc}: {path}"
        for doc, path in _mentions(PATH)
        if not path.endswith("_")  # a stem before a wildcard (test_engine_*.py)
        and (doc, path) not in NOT_OURS
        and not (ROOT / path.rstrip(".")).exists()
    ]
    assert missing == []


def test_every_named_module_exists() -> None:
    missing = [f"{doc}: {name}" for doc, name in _mentions(DOTTED) if not _module_exists(name)]
    assert missing == []


@pytest.fixture(scope="module")
def make_targets() -> set[str]:
    database = subprocess.run(
        ["make", "-pRrq", "-f", "Makefile"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout
    return set(re.findall(r"^([a-z][\w-]*):", database, re.MULTILINE))


def test_every_named_make_target_exists(make_targets: set[str]) -> None:
    assert "test" in make_targets and "run" in make_targets
    missing = [f"{doc}: make {t}" for doc, t in _mentions(MAKE) if t not in make_targets]
    assert missing == []
