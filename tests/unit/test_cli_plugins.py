"""``llmso bench`` and ``llmso plan`` are subcommands the gateway finds through the
``llmso.commands`` entry-point group, never by importing ``bench``."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

from gateway import cli

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_bench_and_plan_as_plugins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"][cli.PLUGINS]
    assert set(declared) == {"bench", "plan"}
    for target in declared.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name))


def test_a_plugin_subcommand_runs_with_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An installed distribution's entry point becomes ``llmso NAME``; its own argv follows."""
    (tmp_path / "llmso_probe_cmd.py").write_text(
        "def main(argv):\n    print('probe', argv)\n    return 7\n"
    )
    dist = tmp_path / "llmso_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llmso-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(f"[{cli.PLUGINS}]\nprobe = llmso_probe_cmd:main\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["probe", "--x", "1"]) == 7
    assert capsys.readouterr().out.strip() == "probe ['--x', '1']"
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "probe" in capsys.readouterr().out
