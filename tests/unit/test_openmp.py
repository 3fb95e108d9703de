"""The default OpenMP wait policy: set for the gateway and its workers, never over the user's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from backends.openmp import apply_wait_policy
from backends.process.connection import _worker_env


def test_wait_policy_defaults_to_passive_unless_chosen() -> None:
    env: dict[str, str] = {}
    assert apply_wait_policy(env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "1000")):
        chosen = {name: value}
        assert not apply_wait_policy(chosen) and chosen == {name: value}


def test_process_workers_get_the_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    monkeypatch.delenv("KMP_LIBRARY", raising=False)
    assert _worker_env({})["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in os.environ  # the parent's environment is left alone
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert _worker_env({})["OMP_WAIT_POLICY"] == "ACTIVE"


_CLI = """
import os, sys
from gateway import cli
assert "torch" not in sys.modules, "the CLI module must not import torch"
try:
    cli.main(["--help"])
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def test_cli_sets_the_policy_before_torch_is_imported() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    run = subprocess.run(
        [sys.executable, "-c", _CLI],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "PASSIVE"
