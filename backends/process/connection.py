"""The parent's handle on one worker process: spawn, multiplex, detect death, terminate.

``WorkerProcess`` is owned by the event loop that spawned it; every method must be
called there. One reader task turns frames into per-request ``RequestStream`` pushes,
observer calls and RPC replies; one watch task awaits the process's exit. When the
process is gone for any reason, every open stream, the ready future and every pending
call fail with ``BackendCrashed`` (or ``WorkerStartError`` before ready), and
``on_lost(worker, reason)`` is called once, on the loop, unless ``terminate()`` caused it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import backends
from backends.base import (
    BackendCrashed,
    BackendError,
    BackendEvent,
    GenerationRequest,
    ModelInfo,
    NotReady,
    UpstreamTimeout,
)
from backends.errors import WorkerStartError
from backends.hop_metrics import WorkerObserver
from backends.process import protocol as p

log = logging.getLogger(__name__)

# After the channel closes, how long the process may linger before we kill it.
EOF_GRACE_S = 2.0


class End:
    """Marks the normal end of a request stream."""


END: Final = End()
StreamItem = BackendEvent | BackendError | End


class RequestStream:
    """Items of one request, pushed by the reader task and drained by ``generate``.

    Loop-owned. Not bounded by count: the worker sends at most ``max_tokens`` deltas per
    choice plus a fixed number of other events, then one terminal item.
    """

    __slots__ = ("_items", "_wake")

    def __init__(self) -> None:
        self._items: deque[StreamItem] = deque()
        self._wake = asyncio.Event()

    def push(self, item: StreamItem) -> None:
        self._items.append(item)
        self._wake.set()

    async def take(self) -> list[StreamItem]:
        """Every item ready now (at least one), so a burst costs one wake-up."""
        while not self._items:
            self._wake.clear()
            await self._wake.wait()
        items = list(self._items)
        self._items.clear()
        return items


def _worker_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment, plus the checkout root on ``PYTHONPATH`` so the worker
    imports the same ``backends`` package (and test factories) as the parent."""
    env = dict(os.environ)
    root = str(Path(backends.__file__).resolve().parent.parent)
    paths = [root, *(x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(extra)
    return env


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


class WorkerProcess:
    """One spawned worker and its socket. Loop-owned; single use (spawn once)."""

    def __init__(
        self, name: str, observer: WorkerObserver, on_lost: Callable[[WorkerProcess, str], None]
    ) -> None:
        self.name = name
        self._observer = observer
        self._on_lost = on_lost
        self._proc: asyncio.subprocess.Process | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._streams: dict[int, RequestStream] = {}
        self._calls: dict[int, asyncio.Future[object]] = {}
        self._asks: dict[int, asyncio.Future[object]] = {}
        self._keys = itertools.count(1)
        self._ready: asyncio.Future[ModelInfo] | None = None
        self._crash_reason: str | None = None
        self._terminating = False
        self.lost_reason: str | None = None

    # ------------------------------------------------------------------ state

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self.lost_reason is None

    @property
    def was_ready(self) -> bool:
        """The engine reported ready at some point (it may have died since)."""
        ready = self._ready
        return ready is not None and ready.done() and ready.exception() is None

    @property
    def is_ready(self) -> bool:
        return self.alive and self.was_ready

    # ------------------------------------------------------------------ lifecycle

    async def spawn(self, config: object, factory_spec: str, env: Mapping[str, str]) -> None:
        """Start the worker and send it its ``INIT``; does not wait for ready."""
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "backends.process.worker",
                "--fd", str(child_sock.fileno()),
                "--parent-pid", str(os.getpid()),
                "--name", self.name,
                pass_fds=(child_sock.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                # Own process group: Ctrl-C on the gateway does not hit the worker
                # directly (the gateway stops it), and terminate() can kill the group.
                start_new_session=True,
                env=_worker_env(env),
            )  # fmt: skip
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=parent_sock)
        self._ready = asyncio.get_running_loop().create_future()
        self._send((p.INIT, config, factory_spec))
        self._tasks = [
            asyncio.create_task(self._read_loop(reader), name=f"worker-read-{self.name}"),
            asyncio.create_task(self._watch(), name=f"worker-watch-{self.name}"),
        ]
        log.info("model %s: started worker pid %s", self.name, self._proc.pid)

    async def wait_ready(self, limit_s: float) -> ModelInfo:
        """The engine's ``ModelInfo`` once it started; raises ``WorkerStartError``."""
        assert self._ready is not None, "spawn() first"
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), limit_s)
        except TimeoutError:
            raise WorkerStartError(
                f"model {self.name!r}: worker pid {self.pid} did not load within {limit_s:g} s"
            ) from None

    async def terminate(self, grace_s: float, reason: str = "stopped") -> None:
        """SIGTERM the worker, SIGKILL its process group after ``grace_s``; reap it.

        Open streams end with ``BackendCrashed`` carrying ``reason``.
        """
        proc = self._proc
        if proc is None:
            return
        self._terminating = True
        self._fail_open(f"model {self.name!r} {reason}")
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("model %s: worker pid %s ignored SIGTERM", self.name, proc.pid)
                self._kill_group(proc.pid)
                await proc.wait()
        self._kill_group(proc.pid)  # anything the worker itself spawned
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._lost(f"worker pid {proc.pid} {reason}")

    # ------------------------------------------------------------------ requests

    def open(self, request: GenerationRequest) -> tuple[int, RequestStream]:
        if not self.is_ready:
            raise NotReady(f"model {self.name!r}: worker is not running")
        key = next(self._keys)
        stream = RequestStream()
        self._streams[key] = stream
        self._send((p.GENERATE, key, request))
        return key, stream

    def close_stream(self, key: int, *, cancel: bool) -> None:
        """Forget a stream; with ``cancel`` tell the worker to abort it."""
        if self._streams.pop(key, None) is not None and cancel and self.alive:
            self._send((p.CANCEL, key))

    async def ask(self, method: str, request: object, limit_s: float) -> object:
        """One whole call of the engine's ``method`` (``protocol.ASKS``) in the worker;
        cancelling the caller cancels it there.

        Raises what the worker's engine raised (same class), ``BackendCrashed`` if the
        worker dies meanwhile, or ``UpstreamTimeout`` after ``limit_s`` (a stuck worker).
        """
        if not self.is_ready:
            raise NotReady(f"model {self.name!r}: worker is not running")
        key = next(self._keys)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._asks[key] = future
        self._send((p.ASK, key, method, request))
        done = False
        try:
            result = await asyncio.wait_for(asyncio.shield(future), limit_s)
            done = True
            return result
        except TimeoutError:
            raise UpstreamTimeout(
                f"model {self.name!r}: the worker gave no {method} answer within {limit_s:g} s"
            ) from None
        except BackendError:
            done = True
            raise
        finally:
            if self._asks.pop(key, None) is not None and not done and self.alive:
                self._send((p.CANCEL, key))

    async def call(self, name: str, limit_s: float, arg: object = None) -> object:
        """A small RPC into the worker; raises ``TimeoutError``, ``BackendCrashed`` or
        the ``BackendError`` the worker's backend raised."""
        if not self.alive:
            raise BackendCrashed(f"model {self.name!r}: worker is not running")
        call_id = next(self._keys)
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._send((p.CALL, call_id, name, arg))
        try:
            value = await asyncio.wait_for(future, limit_s)
        finally:
            self._calls.pop(call_id, None)
        if isinstance(value, p.ErrorPayload):
            raise p.decode_error(value)
        return value

    # ------------------------------------------------------------------ internals

    def _send(self, message: p.Message) -> None:
        # Parent -> worker traffic is small (requests, cancels), so no batching and no
        # drain: the transport buffers, and the worker reads continuously.
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(p.encode_frame([message]))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while (batch := await p.read_frame(reader)) is not None:
                for message in batch:
                    self._dispatch(message)
        except p.ProtocolError as exc:
            log.error("model %s: bad frame from worker: %s", self.name, exc)
        except (ConnectionError, OSError) as exc:
            log.debug("model %s: worker channel error: %r", self.name, exc)
        # The channel is gone; the process should follow. Make sure it does, so that
        # _watch() sees the exit and fails everything in flight (terminate() has its own
        # SIGTERM-then-SIGKILL schedule and is left alone).
        proc = self._proc
        if proc is not None and proc.returncode is None and not self._terminating:
            try:
                await asyncio.wait_for(proc.wait(), EOF_GRACE_S)
            except TimeoutError:
                log.error("model %s: worker closed its channel but lives; killing", self.name)
                self._kill_group(proc.pid)

    async def _watch(self) -> None:
        assert self._proc is not None
        returncode = await self._proc.wait()
        reason = describe_exit(returncode)
        if self._crash_reason is not None:
            reason = f"engine crashed: {self._crash_reason} (worker {reason})"
        self._kill_group(self._proc.pid)
        self._lost(f"worker pid {self._proc.pid} {reason}")

    def _lost(self, reason: str) -> None:
        if self.lost_reason is not None:
            return
        self.lost_reason = reason
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_exception(
                WorkerStartError(f"model {self.name!r}: worker died while loading ({reason})")
            )
            ready.exception()  # nobody may await it any more (a timed-out start)
        self._fail_open(f"model {self.name!r}: {reason}")
        self._close_writer()
        if not self._terminating:
            self._on_lost(self, reason)

    def _fail_open(self, message: str) -> None:
        for stream in self._streams.values():
            stream.push(BackendCrashed(message))
        self._streams.clear()
        futures: list[asyncio.Future[Any]] = [*self._calls.values(), *self._asks.values()]
        for future in futures:
            if not future.done():
                future.set_exception(BackendCrashed(message))
        self._asks.clear()

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()

    @staticmethod
    def _kill_group(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def _dispatch(self, message: p.Message) -> None:
        tag = message[0]
        if tag == p.EVENT:
            stream = self._streams.get(message[1])
            if stream is not None:
                stream.push(p.decode_event(message[2]))
        elif tag in (p.END, p.ERROR):
            stream = self._streams.pop(message[1], None)
            if stream is not None:
                stream.push(END if tag == p.END else p.decode_error(message[2]))
            elif tag == p.ERROR:
                self._settle_ask(message[1], p.decode_error(message[2]))
        elif tag == p.ANSWER:
            self._settle_ask(message[1], message[2])
        elif tag == p.OBSERVE:
            self._observe(message[1], message[2])
        elif tag == p.REPLY:
            future = self._calls.get(message[1])
            if future is not None and not future.done():
                future.set_result(message[2])
        elif tag == p.READY:
            self._on_ready(message[1])
        elif tag == p.LOAD_ERROR:
            if self._ready is not None and not self._ready.done():
                self._ready.set_exception(
                    WorkerStartError(f"model {self.name!r}: engine failed to load: {message[1]}")
                )
        elif tag == p.CRASHED:
            self._crash_reason = str(message[1])
        else:
            log.error("model %s: unknown message %r from worker", self.name, tag)

    def _settle_ask(self, key: int, outcome: object) -> None:
        future = self._asks.get(key)
        if future is None or future.done():
            return
        if isinstance(outcome, BackendError):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def _on_ready(self, info: ModelInfo) -> None:
        if self._ready is not None and not self._ready.done():
            extra = {**info.extra, "pid": str(self.pid), "isolation": "process"}
            self._ready.set_result(replace(info, extra=extra))

    def _observe(self, method: str, args: Any) -> None:
        if method not in p.OBSERVER_METHODS:
            return
        try:
            getattr(self._observer, method)(*args)
        except Exception:
            log.exception("model %s: observer %s failed", self.name, method)
