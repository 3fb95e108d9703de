"""Where ``llmso serve`` (and ``make run``) listens: the flag, else ``LLMSO_HOST`` /
``LLMSO_PORT``, else the config's ``server:`` section, else 127.0.0.1:8000."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from config.loader import load_config
from config.schema import AppConfig
from gateway import cli
from gateway.edge.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MODEL = "models:\n  - {name: a, backend: hf, source: x}\n"


@pytest.fixture(autouse=True)
def _no_bind_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLMSO_HOST", "LLMSO_PORT", "LLMSO_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _config(tmp_path: Path, server: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(server + MODEL)
    return path


@pytest.mark.parametrize(
    ("flags", "env", "server", "expected"),
    [
        ((None, None), {}, "", ("127.0.0.1", 8000)),
        ((None, None), {}, "server: {host: 0.0.0.0, port: 9001}\n", ("0.0.0.0", 9001)),
        (
            (None, None),
            {"LLMSO_HOST": "10.0.0.2", "LLMSO_PORT": "9002"},
            "server: {host: 0.0.0.0, port: 9001}\n",
            ("10.0.0.2", 9002),
        ),
        (
            ("10.0.0.3", 9003),
            {"LLMSO_HOST": "10.0.0.2", "LLMSO_PORT": "9002"},
            "server: {host: 0.0.0.0, port: 9001}\n",
            ("10.0.0.3", 9003),
        ),
        # Host and port are decided apart: a port flag leaves the config's host.
        ((None, 9003), {}, "server: {host: 0.0.0.0, port: 9001}\n", ("0.0.0.0", 9003)),
        ((None, None), {"LLMSO_PORT": "9002"}, "server: {host: 0.0.0.0}\n", ("0.0.0.0", 9002)),
        # Port 0 (any free port) is a value, not "unset".
        ((None, 0), {}, "server: {port: 9001}\n", ("127.0.0.1", 0)),
    ],
)
def test_flag_beats_env_beats_config_beats_default(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    flags: tuple[str | None, int | None],
    env: dict[str, str],
    server: str,
    expected: tuple[str, int],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load_config(_config(tmp_path, server))
    host, port = flags
    bind = cli.Bind.of(argparse.Namespace(host=host, port=port), Settings(), config)
    assert (bind.host, bind.port) == expected


def test_serve_passes_its_flags_and_the_config_to_the_bind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []

    def fake_serve(
        config: AppConfig, settings: Settings, bind: cli.Bind, seat: object | None
    ) -> int:
        seen.append((bind.host, bind.port))
        return 0

    monkeypatch.setattr(cli, "_serve", fake_serve)
    path = _config(tmp_path, "server: {host: 0.0.0.0, port: 9001}\n")
    assert cli.main(["serve", "--config", str(path)]) == 0
    assert cli.main(["serve", "--config", str(path), "--port", "9005"]) == 0
    monkeypatch.setenv("LLMSO_HOST", "10.0.0.2")
    assert cli.main(["serve", "--config", str(path)]) == 0
    assert seen == [("0.0.0.0", 9001), ("0.0.0.0", 9005), ("10.0.0.2", 9001)]


def test_a_bad_config_prints_one_line_per_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config(tmp_path, "server: {port: 99999, host: [1]}\n")
    assert cli.main(["serve", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert all(line.startswith(f"llmso: bad config: {path}: server.") for line in lines)


def _make_run_command(**variables: str) -> str:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "MAKEFLAGS")}
    args = [f"{name}={value}" for name, value in variables.items()]
    dry = subprocess.run(
        [make, "-n", "--no-print-directory", "run", "CONFIG=x.yaml", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (serve,) = [line for line in dry.stdout.splitlines() if "llmso serve" in line]
    return serve


def test_make_run_leaves_the_bind_address_to_the_config() -> None:
    serve = _make_run_command()
    assert "--config x.yaml" in serve
    assert "--host" not in serve and "--port" not in serve, serve


def test_make_run_passes_host_and_port_when_given() -> None:
    assert _make_run_command(HOST="0.0.0.0", PORT="9000").split()[-4:] == [
        "--host",
        "0.0.0.0",
        "--port",
        "9000",
    ]
    serve = _make_run_command(PORT="9000")
    assert "--port 9000" in serve and "--host" not in serve, serve
