"""Start real servers as subprocesses for end-to-end tests.

Each server gets a free port, is polled until healthy (with a deadline), and is stopped
at teardown by killing its whole process group, so no orphan outlives a test module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
# What a model worker process (``isolation: process``) needs to load packaged models offline.
WORKER_ENV = {
    "LLMSO_MODEL_CACHE": os.environ.get("LLMSO_MODEL_CACHE", str(REPO / ".models")),
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RunningServer:
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_process(
    argv: Sequence[str],
    *,
    port: int,
    health_path: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
) -> RunningServer:
    fd, log_name = tempfile.mkstemp(prefix="llmso-server-", suffix=".log")
    with os.fdopen(fd, "wb") as log_file:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = RunningServer(process, port, Path(log_name))
    try:
        wait_healthy(server, health_path, timeout)
    except BaseException:
        stop_process(server)
        raise
    return server


def wait_healthy(server: RunningServer, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"server exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + path, timeout=2.0).status_code == 200:
                return
        time.sleep(0.25)
    raise TimeoutError(f"server not healthy after {timeout:.0f}s:\n{server.log_tail()}")


def stop_process(server: RunningServer, grace: float = 10.0) -> None:
    if server.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(5)
    # Children that survived their parent (same process group) go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.process.pid, signal.SIGKILL)


def write_config(directory: Path, config: Mapping[str, object]) -> Path:
    path = directory / "llmso.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    return path


@contextlib.contextmanager
def gateway(
    config: Mapping[str, object],
    *,
    timeout: float = 180.0,
    env: Mapping[str, str] | None = None,
) -> Iterator[RunningServer]:
    """Run ``llmso serve`` on ``config`` (a dict) until the block ends."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="llmso-gw-") as tmp:
        path = write_config(Path(tmp), config)
        server = start_process(
            [str(VENV_BIN / "llmso"), "serve", "--config", str(path), "--port", str(port)],
            port=port,
            health_path="/ready",
            timeout=timeout,
            env={"LLMSO_WATCH_CONFIG": "false", **(env or {})},
        )
        try:
            yield server
        finally:
            stop_process(server)


def serve_file(path: Path, env: Mapping[str, str], timeout: float = 240.0) -> RunningServer:
    """Start ``llmso serve`` on a config file the test edits (hot reload); the caller
    stops it with ``stop_process``."""
    port = free_port()
    return start_process(
        [str(VENV_BIN / "llmso"), "serve", "--config", str(path), "--port", str(port)],
        port=port,
        health_path="/ready",
        timeout=timeout,
        env=env,
    )


def engines_required() -> bool:
    """Whether a test must fail rather than skip what it cannot judge here
    (``LLMSO_REQUIRE_ENGINES=1``, which ``make test`` sets)."""
    return os.environ.get("LLMSO_REQUIRE_ENGINES") == "1"


def engine_required(name: str, marker: Path) -> str | None:
    """``None`` when ``marker`` exists; else the reason to skip (or fail, under
    ``LLMSO_REQUIRE_ENGINES=1``, which ``make test`` sets)."""
    if marker.exists():
        return None
    reason = f"{name} is not set up ({marker} missing; run `make {name}`)"
    if engines_required():
        raise RuntimeError(reason)
    return reason


PYTHON = sys.executable
