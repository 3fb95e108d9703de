"""``bench/`` is the product (``llmso bench``, ``llmso plan``); ``bench/studies/`` holds the
one-off studies, which are not shipped and which nothing depends on.

- no module under ``tests/`` imports a study (a test runs one as a subprocess, if at all);
- the shipped part of ``bench`` never imports a study, nor ``tests`` (the studies may:
  they run from a checkout);
- the wheel's packages, found as ``pyproject.toml``'s ``[tool.setuptools.packages.find]``
  says, hold ``bench`` and ``bench.plan`` and no ``bench.studies``;
- docs/benchmarks/README.md's studies table names every study, with the command that runs
  it, and names no study that is not there.

The product never importing ``bench`` at all is ``test_layers.py``'s.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from setuptools import find_packages

from tests.unit.test_layers import imports, modules

ROOT = Path(__file__).resolve().parents[2]
STUDIES = "bench.studies"


def imports_of(root: Path, package: str, target: str, *, skip: str | None = None) -> list[str]:
    """``module:line -> name`` for each import of ``target`` (or a module in it) in
    ``package`` under ``root``, leaving out the modules of package ``skip``."""
    return [
        f"{edge.source}:{edge.line} -> {edge.target}"
        for name, path in modules(root, package).items()
        if skip is None or not (name == skip or name.startswith(f"{skip}."))
        for edge in imports(name, path)
        if edge.target == target or edge.target.startswith(f"{target}.")
    ]


def test_no_test_imports_a_study() -> None:
    assert imports_of(ROOT, "tests", STUDIES) == []


def test_the_shipped_bench_imports_no_study_and_no_test() -> None:
    assert imports_of(ROOT, "bench", STUDIES, skip=STUDIES) == []
    assert imports_of(ROOT, "bench", "tests", skip=STUDIES) == []


def test_the_check_sees_hidden_study_imports(tmp_path: Path) -> None:
    """A function-local import is found; ``skip`` leaves only the named package out."""
    (tmp_path / "bench" / "studies").mkdir(parents=True)
    (tmp_path / "bench" / "a.py").write_text("def f():\n    from bench.studies import x\n")
    (tmp_path / "bench" / "studies" / "x.py").write_text("import bench.studies.y\n")
    assert imports_of(tmp_path, "bench", STUDIES) == [
        "bench.a:2 -> bench.studies.x",
        "bench.studies.x:1 -> bench.studies.y",
    ]
    assert imports_of(tmp_path, "bench", STUDIES, skip=STUDIES) == ["bench.a:2 -> bench.studies.x"]


def wheel_packages() -> list[str]:
    """The packages ``pip install .`` puts in the wheel, from pyproject's find config."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    find = config["tool"]["setuptools"]["packages"]["find"]
    return find_packages(
        str(ROOT), include=find.get("include", ("*",)), exclude=find.get("exclude", ())
    )


def test_the_wheel_ships_bench_but_no_study() -> None:
    shipped = wheel_packages()
    assert {"gateway", "backends", "config", "bench", "bench.plan"} <= set(shipped)
    assert [p for p in shipped if p == STUDIES or p.startswith(f"{STUDIES}.")] == []
    assert [p for p in shipped if p.split(".")[0] == "tests"] == []


STUDY_ROW = re.compile(r"^\| `bench/studies/(\w+)\.py` \| ([^|]+) \| ([^|]+) \|$", re.M)


def test_the_benchmarks_readme_names_every_study_and_its_command() -> None:
    rows = {
        name: (command, results)
        for name, command, results in STUDY_ROW.findall(
            (ROOT / "docs/benchmarks/README.md").read_text()
        )
    }
    folder = ROOT / "bench/studies"
    studies = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert studies  # the walk found the folder
    assert sorted(rows) == studies
    for name, (command, results) in rows.items():
        if "__main__" in (folder / f"{name}.py").read_text():
            assert f"python -m bench.studies.{name}" in command, name
        named = re.findall(r"`([\w./-]+)`", results)
        assert all((ROOT / "docs/benchmarks" / path).exists() for path in named), name
