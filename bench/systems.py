"""Server processes started by the harness: start, wait for health, pause, stop.

Each :class:`ManagedProcess` is owned by the coroutine that created it (the comparison
driver) and runs in its own session/process group, so stopping it (SIGTERM, then SIGKILL
after a grace period) takes its children with it and its CPU can be measured as a group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import aiohttp

from bench.procstat import group_cpu_seconds


class StartupError(RuntimeError):
    """A server exited or did not become healthy in time."""


def free_port() -> int:
    """A TCP port that was free a moment ago (the usual bind-to-0 race applies)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, limit: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


class ManagedProcess:
    """One subprocess in its own process group, logging to ``log_path``, with the
    harness's environment less the names in ``unset``, plus ``env``."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        *,
        unset: Collection[str] = (),
    ) -> None:
        self.name = name
        self.command = tuple(command)
        self.log_path = log_path
        inherited = {k: v for k, v in os.environ.items() if k not in unset}
        self._env = {**inherited, **(env or {})}
        self._cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    async def wait_healthy(
        self, session: aiohttp.ClientSession, url: str, timeout_s: float
    ) -> float:
        """Poll ``url`` until it answers 200; returns seconds waited. Raises StartupError."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if not self.alive():
                raise StartupError(
                    f"{self.name} exited with {self._proc and self._proc.returncode}; "
                    f"log tail:\n{_tail(self.log_path)}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with asyncio.timeout(5.0), session.get(url) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            await asyncio.sleep(0.5)
        raise StartupError(
            f"{self.name} not healthy at {url} after {timeout_s:g}s; "
            f"log tail:\n{_tail(self.log_path)}"
        )

    def cpu_seconds(self) -> float | None:
        """CPU seconds used so far by the whole process group."""
        return None if self._proc is None else group_cpu_seconds(self._proc.pid)

    def pause(self) -> None:
        """SIGSTOP the group so an idle server cannot steal CPU from the one being measured."""
        if self.alive() and not self._paused and self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._paused and self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGCONT)
            self._paused = False

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``; safe to call twice."""
        proc = self._proc
        if proc is None:
            return
        self.resume()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        # Children may outlive the leader: kill whatever is left of the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
