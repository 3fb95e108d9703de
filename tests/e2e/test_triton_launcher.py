"""The Triton launcher's guard against a model load that hangs (seen under CPU pressure:
the stub never finished ``initialize`` and ignored SIGTERM). It must kill the server and
the stub, remove the shared-memory regions it made, retry, and finally give up."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.tools.servers import free_port
from tests.tools.triton_server import RUN_SH, triton_missing

pytestmark = [pytest.mark.e2e, pytest.mark.engine("triton")]

_missing = triton_missing()
if _missing:
    pytest.skip(_missing, allow_module_level=True)

HANG_CONFIG = """
name: "hang"
backend: "python"
max_batch_size: 0
input [ { name: "PROMPT", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "RESPONSE", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""
HANG_MODEL = """
import os
import signal
import time


class TritonPythonModel:
    def initialize(self, args):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.environ["HANG_MARKER"], "a") as marker:
            marker.write(f"{os.getpid()}\\n")
        time.sleep(3600)

    def execute(self, requests):
        return []
"""


def test_hung_load_is_killed_retried_and_cleaned(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "hang" / "1").mkdir(parents=True)
    (repo / "hang" / "config.pbtxt").write_text(HANG_CONFIG)
    (repo / "hang" / "1" / "model.py").write_text(HANG_MODEL)
    marker = tmp_path / "stubs.txt"
    argv = [
        str(RUN_SH), str(free_port()), str(free_port()), str(free_port()),
        "--model-repository", str(repo), "--model", "hang",
        "--load-timeout", "8", "--retries", "1",
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(
        argv,
        check=False,
        env={**os.environ, "HANG_MARKER": str(marker)},
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.count("not ready after 8s, killing") == 2
    assert "attempt 2 failed" in done.stderr
    assert 16 <= elapsed < 90

    stub_pids = [int(line) for line in marker.read_text().split()]
    assert len(stub_pids) == 2, "each attempt should have reached the model's initialize"
    for pid in stub_pids:
        assert not _alive(pid), f"stub {pid} survived the launcher"
    leftovers = [p.name for p in Path("/dev/shm").glob("llmso_triton_*") if _owner_gone(p.name)]
    assert not leftovers, leftovers


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _owner_gone(name: str) -> bool:
    """Regions are named llmso_triton_<launcher pid>_...; only dead launchers' count."""
    try:
        pid = int(name.split("_")[2])
    except (IndexError, ValueError):
        return False
    return not _alive(pid)
