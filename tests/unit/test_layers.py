"""The layer contracts of the product, read from the source with ``ast``.

Every ``import`` counts: module level, under ``TYPE_CHECKING`` and inside functions, so
a function-local import cannot hide a cycle. The contracts:

- no import cycle inside ``gateway/`` (nor inside ``backends/`` or ``config/``);
- the product (``gateway``, ``backends``, ``config``) never imports ``bench`` or ``tests``;
- ``backends`` never imports ``gateway``, FastAPI or Starlette (the HTTP layer);
- ``config`` never imports ``gateway`` or ``bench``;
- inside ``gateway``, every package (and top-level module) imports only those below it
  in ``MAY_IMPORT``: ``cli`` -> ``app`` -> ``edge`` -> ``batch`` -> ``api`` -> ``service``
  -> ``access`` -> ``registry`` -> ``observe``, with ``console`` and ``fleet`` under the
  edge and ``errors`` at the bottom (docs/architecture.md). Nothing below the edge imports it.
  Every package under ``gateway/`` has a row, and the rows point down (no package may
  reach itself through them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("gateway", "backends", "config")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module, dotted
    target: str  # imported name, dotted (a module, or a name inside one)
    line: int


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path) -> Iterator[Edge]:
    """Every import in the module ``name`` (at ``path``), wherever it stands."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Edge(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                # ``from a import b`` imports the module ``a.b`` when there is one.
                yield Edge(name, f"{module}.{alias.name}", node.lineno)


def internal_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """Module -> the modules of the same package it imports (-> line)."""
    known = modules(root, package)

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        for edge in imports(name, path):
            target = resolve(edge.target)
            if target is not None and target != name and not name.startswith(f"{target}."):
                # A module importing its own package's __init__ is Python's import
                # order, not a dependency edge.
                graph[name].setdefault(target, edge.line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, {}):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def forbidden(root: Path, package: str, banned: tuple[str, ...]) -> list[str]:
    """``module:line -> target`` for each import in ``package`` of a ``banned`` top name."""
    return [
        f"{edge.source}:{edge.line} -> {edge.target}"
        for name, path in modules(root, package).items()
        for edge in imports(name, path)
        if edge.target.split(".")[0] in banned
    ]


@pytest.mark.parametrize("package", PRODUCT)
def test_no_import_cycles(package: str) -> None:
    assert cycles(internal_graph(ROOT, package)) == []


@pytest.mark.parametrize("package", PRODUCT)
def test_product_never_imports_bench_or_tests(package: str) -> None:
    assert forbidden(ROOT, package, ("bench", "tests")) == []


def test_backends_never_import_the_http_layer() -> None:
    assert forbidden(ROOT, "backends", ("gateway", "fastapi", "starlette")) == []


def test_config_never_imports_gateway() -> None:
    assert forbidden(ROOT, "config", ("gateway",)) == []


def test_the_checks_see_hidden_cycles_and_banned_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle closed by a function-local or ``TYPE_CHECKING``
    import is found, and so is a banned import inside a function."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import a\n    import bench.cli\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nfrom . import d\n")
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n"
    )
    assert cycles(internal_graph(tmp_path, "pkg")) == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]
    assert forbidden(tmp_path, "pkg", ("bench",)) == ["pkg.sub.b:3 -> bench.cli"]


MAY_IMPORT = {
    "cli": {"app", "edge", "fleet", "observe"},
    "app": {
        "edge",
        "fleet",
        "batch",
        "console",
        "api",
        "service",
        "access",
        "registry",
        "observe",
        "errors",
    },
    "edge": {
        "fleet",
        "batch",
        "console",
        "api",
        "service",
        "access",
        "registry",
        "observe",
        "errors",
    },
    "fleet": {"api", "access"},
    "batch": {"api", "access", "registry", "observe", "errors"},
    "console": {"observe"},
    "api": {"service", "observe", "errors"},
    "service": {"access", "registry", "observe", "errors"},
    "access": {"registry", "observe", "errors"},
    "registry": set(),
    "observe": set(),
    "errors": set(),
}
"""Each of ``gateway``'s packages and top-level modules, top to bottom, and the others it
imports. ``edge`` is the HTTP layer: the ASGI entry point, the front door's HTTP checks,
the operational and console routes. ``batch`` and ``console`` sit under it (the batch
runner serves lines through ``api``'s endpoints; the console holds what its views show),
``access`` (client keys, limits, usage) under the service, which asks it which models a
key may use. ``fleet`` (the workers of ``--workers N``, their supervisor and hub) sits
under the edge, whose views merge what it gathers, and over ``api`` and ``access``,
whose stores its hub serves. ``errors`` is a module: the HTTP-only errors and their one renderer."""


def gateway_package(module: str) -> str:
    """``gateway.edge.call`` -> ``edge``; a top-level module (``gateway.errors``) -> ``errors``."""
    return module.split(".")[1] if module.count(".") else ""


def gateway_parts(root: Path = ROOT) -> set[str]:
    """Every package and top-level module under ``gateway/`` (``__init__`` aside)."""
    found = {p.name for p in (root / "gateway").iterdir() if (p / "__init__.py").is_file()}
    found |= {p.stem for p in (root / "gateway").glob("*.py") if p.stem != "__init__"}
    return found


def test_every_gateway_package_has_a_row() -> None:
    """A new package (or a renamed one) cannot escape the layer check."""
    parts = gateway_parts()
    assert {"edge", "access", "registry"} <= parts  # the walk found the tree
    assert sorted(parts - MAY_IMPORT.keys()) == []
    assert sorted(MAY_IMPORT.keys() - parts) == []  # no row for a package that is gone


def test_the_rows_point_down() -> None:
    """No package may reach itself through ``MAY_IMPORT``: the rows are layers, not a
    web, so each may import only what sits below it."""

    def reach(name: str) -> set[str]:
        found: set[str] = set()
        todo = [name]
        while todo:
            for lower in MAY_IMPORT.get(todo.pop(), set()) - found:
                found.add(lower)
                todo.append(lower)
        return found

    assert [name for name in MAY_IMPORT if name in reach(name)] == []


def test_gateway_imports_point_down() -> None:
    upward = [
        f"{source} -> {target}"
        for source, targets in internal_graph(ROOT, "gateway").items()
        if (here := gateway_package(source))
        for target in targets
        if (there := gateway_package(target)) and there != here
        if there not in MAY_IMPORT.get(here, set())
    ]
    assert upward == []


def test_the_rows_say_the_truth() -> None:
    """Every import a row allows is made: the table is the layering as it is, not a
    looser wish (drop a row's entry when its last import goes)."""
    used: dict[str, set[str]] = {name: set() for name in MAY_IMPORT}
    for source, targets in internal_graph(ROOT, "gateway").items():
        here = gateway_package(source)
        for target in targets:
            there = gateway_package(target)
            if here in used and there and there != here:
                used[here].add(there)
    assert used == MAY_IMPORT
