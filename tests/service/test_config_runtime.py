"""Config files at run time, with the real process around them: the CLI's exit status on
a bad file, and the watcher reloading on file changes and on SIGHUP (signals and a
polling thread: not unit tests)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from config.loader import load_config
from gateway.registry import ConfigWatcher, ModelRegistry, RegistryMetrics
from tests.tools.registry_fakes import FakeFactory, fake_model, wait_until
from tests.tools.servers import VENV_BIN


def test_cli_exits_2_on_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models: []\n")
    result = subprocess.run(
        [str(VENV_BIN / "llmso"), "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "models" in lines[0]


def _write(path: Path, models: list[dict[str, Any]]) -> None:
    path.write_text(yaml.safe_dump({"models": models}))


async def test_watcher_reloads_on_change_rejects_bad_config_and_sighup(tmp_path: Path) -> None:
    path = tmp_path / "llmso.yaml"
    _write(path, [fake_model("a")])
    factory = FakeFactory()
    registry = ModelRegistry(load_config(path), RegistryMetrics(CollectorRegistry()), factory)
    await registry.start()
    watcher = ConfigWatcher(registry, path, interval=0.02)
    watcher.start()
    try:
        _write(path, [fake_model("a"), fake_model("b")])
        await wait_until(lambda: "b" in {s.name for s in registry.list_models()})
        path.write_text("models: [{name: c, backend: nosuch}]\n")
        await wait_until(lambda: watcher.rejected == 1)
        assert [s.name for s in registry.list_models()] == ["a", "b"]  # old config serves
        assert registry.route("b").candidates == ("b",)
    finally:
        await watcher.stop()
    # SIGHUP alone (no polling to race with): the loop runs in pytest's main thread.
    watcher = ConfigWatcher(registry, path, interval=3600)
    watcher.start()
    try:
        assert watcher.signal_installed
        _write(path, [fake_model("c")])
        os.kill(os.getpid(), signal.SIGHUP)
        await wait_until(lambda: watcher.reloads == 1)
        assert [s.name for s in registry.list_models()] == ["c"]
    finally:
        await watcher.stop()
        await registry.stop()
    assert not watcher.signal_installed
