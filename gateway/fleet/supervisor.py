"""The supervisor of ``llmso serve --workers N``: N gateway processes on one port.

It reserves the port (``gateway.fleet.sockets``), opens the hub (``gateway.fleet.hub``)
on a UNIX socket in a private run directory, and starts each worker as ``python -m
gateway.cli serve`` with its seat in the environment (``gateway.fleet.link.Seat``). The
workers share its process group, so a process-group CPU reading or kill covers them all.

Lifecycle:

- **A worker exits** while the fleet serves: it is restarted after a backoff that
  doubles from ``RESTART_MIN`` to ``RESTART_MAX`` seconds and starts over once a worker
  has lived ``HEALTHY_AFTER`` seconds. A worker that exits before any worker has joined
  the hub means the fleet cannot start (a bad config, a port in use): the supervisor
  stops the others and exits with 1.
- **SIGTERM**: the drain of ``gateway.edge.drain``, for every worker at once. Each gets
  SIGUSR1 (its first SIGTERM: ``/ready`` 503 for ``server.drain_grace``, then the
  listener closes and in-flight requests get ``server.drain_timeout``); none is
  restarted; the supervisor exits 0 when all have. A second SIGTERM, or SIGINT, sends
  SIGUSR2 (skip the grace). Workers past grace + timeout + ``KILL_MARGIN`` are killed.
  Workers ignore SIGTERM and SIGINT themselves, so a signal to the whole group (Ctrl-C,
  systemd, a test harness) drains each worker once, through here.
- **SIGHUP** is passed to every worker (each reloads its config; see docs/workers.md).

``Supervisor`` owns the workers' processes, the hub, the reserved socket and the run
directory, all on its own event loop; ``run`` returns the exit status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from config.frontdoor import LimitsConfig
from config.schema import AppConfig, ResponsesConfig
from gateway.fleet.hub import Hub
from gateway.fleet.link import HUB_ENV, SECRET_ENV, WORKER_ENV, WORKERS_ENV
from gateway.fleet.sockets import reuseport_socket
from gateway.fleet.stores import SharedStores

log = logging.getLogger("llmso.fleet")

RESTART_MIN = 0.5
RESTART_MAX = 30.0
HEALTHY_AFTER = 30.0
KILL_MARGIN = 10.0
WORKER_COMMAND = (sys.executable, "-m", "gateway.cli", "serve")


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """What the supervisor runs: how many workers, where, on which config file, and
    which stores its hub serves (``None``: the workers use the configured Redis)."""

    workers: int
    host: str
    port: int
    config_path: Path
    drain_grace: float
    drain_timeout: float
    limits: LimitsConfig | None
    responses: ResponsesConfig | None

    @classmethod
    def of(cls, config: AppConfig, workers: int, host: str, port: int) -> FleetPlan:
        if config.source_path is None:
            raise ValueError("workers > 1 needs a config file (each worker reads it)")
        responses_where = config.responses.store or config.limits.store
        return cls(
            workers=workers,
            host=host,
            port=port,
            config_path=config.source_path,
            drain_grace=config.server.drain_grace,
            drain_timeout=config.server.drain_timeout,
            limits=config.limits if config.limits.store == "memory" else None,
            responses=config.responses if responses_where == "memory" else None,
        )


class Supervisor:
    """See the module docstring."""

    def __init__(self, plan: FleetPlan, command: Sequence[str] = WORKER_COMMAND) -> None:
        self.plan = plan
        self._command = tuple(command)
        self._hub = Hub(SharedStores(plan.limits, plan.responses))
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._stop = asyncio.Event()
        self._drains_sent = 0
        self._failed = False
        self.port = plan.port
        # One key for every worker's ThoughtSeal when the config names none, so a thought
        # handed out by one worker is read back by any other (docs/reasoning.md).
        self._seal_secret = secrets.token_hex(32)

    def run(self) -> int:
        import uvloop  # the loop the workers run on too: the hub's store calls cost less

        status: int = uvloop.run(self.main())
        return status

    async def main(self) -> int:
        reserved = reuseport_socket(self.plan.host, self.plan.port)
        self.port = reserved.getsockname()[1]
        run_dir = tempfile.mkdtemp(prefix="llmso-fleet-")  # 0700: only this user
        try:
            await self._hub.start(os.path.join(run_dir, "hub.sock"))
            self._install_signals()
            log.info(
                "supervisor pid %d: %d workers on %s:%d",
                os.getpid(),
                self.plan.workers,
                self.plan.host,
                self.port,
            )
            keepers = [
                asyncio.create_task(self._keep(i, run_dir), name=f"fleet-worker-{i}")
                for i in range(self.plan.workers)
            ]
            killer = asyncio.create_task(self._kill_after_deadline(), name="fleet-killer")
            await asyncio.gather(*keepers)
            killer.cancel()
            log.info("supervisor: every worker has exited")
        finally:
            self._remove_signals()
            await self._hub.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            reserved.close()
        return 1 if self._failed else 0

    # ------------------------------------------------------------------ workers

    def _env(self, index: int, run_dir: str) -> dict[str, str]:
        return {
            **os.environ,
            "LLMSO_CONFIG": str(self.plan.config_path),
            "LLMSO_HOST": self.plan.host,
            "LLMSO_PORT": str(self.port),
            WORKERS_ENV: str(self.plan.workers),
            HUB_ENV: os.path.join(run_dir, "hub.sock"),
            WORKER_ENV: str(index),
            SECRET_ENV: self._seal_secret,
        }

    async def _keep(self, index: int, run_dir: str) -> None:
        """Run worker ``index`` until the fleet stops, restarting it with backoff."""
        backoff = RESTART_MIN
        while not self._stop.is_set():
            started = time.monotonic()
            proc = await asyncio.create_subprocess_exec(
                *self._command, env=self._env(index, run_dir)
            )
            self._procs[index] = proc
            if self._stop.is_set():  # a drain began while it was being spawned
                self._signal(proc, signal.SIGUSR1)
            status = await proc.wait()
            del self._procs[index]
            if self._stop.is_set():
                return
            if self._hub.joined == 0:
                log.error(
                    "worker %d exited with %s before the fleet started; stopping", index, status
                )
                self._failed = True
                self._begin_stop(signal.SIGUSR2)
                return
            lived = time.monotonic() - started
            if lived >= HEALTHY_AFTER:
                backoff = RESTART_MIN
            log.error(
                "worker %d (pid %d) exited with %s after %.1fs; restarting in %.1fs",
                index,
                proc.pid,
                status,
                lived,
                backoff,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), backoff)
            backoff = min(backoff * 2, RESTART_MAX)

    async def _kill_after_deadline(self) -> None:
        await self._stop.wait()
        await asyncio.sleep(self.plan.drain_grace + self.plan.drain_timeout + KILL_MARGIN)
        for index, proc in list(self._procs.items()):
            log.error("worker %d (pid %d) still running after the drain: killed", index, proc.pid)
            self._signal(proc, signal.SIGKILL)

    # ------------------------------------------------------------------ signals

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self._begin_stop, signal.SIGUSR2)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)

    def _remove_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)

    def _on_sigterm(self) -> None:
        # The first drains (SIGUSR1), a second skips the grace (SIGUSR2).
        self._begin_stop(signal.SIGUSR1 if self._drains_sent == 0 else signal.SIGUSR2)

    def _begin_stop(self, how: signal.Signals) -> None:
        self._drains_sent += 1
        if not self._stop.is_set():
            log.info(
                "supervisor: %s to every worker",
                "draining" if how == signal.SIGUSR1 else "stopping",
            )
        self._stop.set()
        self._forward(how)

    def _forward(self, sig: signal.Signals) -> None:
        for proc in self._procs.values():
            self._signal(proc, sig)

    @staticmethod
    def _signal(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
