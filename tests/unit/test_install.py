"""The install works on machines without our local wheel folder, and the container image
installs exactly as `make run` does.

PyTorch's CPU index cannot be reached from the test machines, so these tests check the
pip commands the Makefile builds (``make -n``), not a download.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TORCH_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _make(*args: str, dry: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *(["-n"] if dry else []), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _pip_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if " -m pip install " in line]


def test_without_the_wheel_folder_torch_comes_from_pytorchs_cpu_index(tmp_path: Path) -> None:
    run = _make("install", f"VENV={tmp_path}/venv", f"WHEELS={tmp_path}/none")
    assert run.returncode == 0, run.stderr
    lines = _pip_lines(run.stdout)
    assert any("-r requirements.txt" in line for line in lines)
    assert all(TORCH_INDEX in line and "--find-links" not in line for line in lines)


def test_with_the_wheel_folder_torch_comes_from_it(tmp_path: Path) -> None:
    run = _make("install", f"VENV={tmp_path}/venv", f"WHEELS={tmp_path}")
    assert run.returncode == 0, run.stderr
    lines = _pip_lines(run.stdout)
    assert lines and all(f"--find-links {tmp_path}" in line for line in lines)
    assert not any("--extra-index-url" in line for line in lines)


def test_torch_pin_is_a_cpu_build_that_needs_the_index_or_the_folder() -> None:
    pins = (REPO / "requirements.txt").read_text()
    assert re.search(r"^torch==[\d.]+\+cpu$", pins, re.MULTILINE)


def test_no_python_311_says_what_to_install(tmp_path: Path) -> None:
    run = _make("install", "PYTHON=", f"VENV={tmp_path}/venv", dry=False)
    assert run.returncode != 0
    assert "no Python 3.11 with venv support found" in run.stderr
    assert "apt-get install python3.11 python3.11-venv" in run.stderr
    assert not (tmp_path / "venv").exists()


def _dockerfile_runs() -> list[str]:
    text = (REPO / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    return [line[4:] for line in text.splitlines() if line.startswith("RUN ")]


def test_the_image_installs_through_make_install_only() -> None:
    runs = " && ".join(_dockerfile_runs())
    assert re.search(r"\bmake install\b", runs)
    assert "pip install" not in runs, "the image must not install packages its own way"


def test_the_image_copies_everything_make_install_reads() -> None:
    copied = set()
    for line in (REPO / "deploy" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            copied.update(Path(word).name for word in line.split()[1:-1])
    run = _make("-p", "install", "VENV=.venv-probe")
    rule = re.search(r"^\.venv-probe/\.stamp-runtime: (.*)$", run.stdout, re.MULTILINE)
    assert rule is not None, "the Makefile's install rule moved"
    needed = set(rule.group(1).split()) | {"Makefile"}
    assert needed <= copied, f"the image misses {sorted(needed - copied)}"
    packages = re.findall(
        r"^include = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.MULTILINE
    )
    for package in re.findall(r'"(\w+)\*"', packages[0]):
        assert package in copied, f"the image misses the {package} package"


@pytest.mark.parametrize("target", ["setup", "run"])
def test_run_and_setup_install_through_the_same_target(target: str, tmp_path: Path) -> None:
    run = _make(target, f"VENV={tmp_path}/venv", f"WHEELS={tmp_path}/none")
    assert "-r requirements.txt" in run.stdout and "requirements-nodeps.txt" in run.stdout
