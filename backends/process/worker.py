"""The worker process: ``python -m backends.process.worker --fd N --parent-pid P``.

It reads an ``INIT`` message from the inherited socket ``N``, builds the engine backend
named by the factory spec (``module:Class``, called as ``Class(config, observer,
on_crash=...)`` the way ``backends.factory`` builds ``HFBackend``), starts it, says
``READY`` and then serves ``GENERATE``/``ASK``/``CANCEL``/``CALL`` messages until the parent
says ``STOP``, closes the socket, dies or sends SIGTERM.

Ownership: everything here runs on the worker's event loop, except the observer, which
the engine may call from its own thread; it only hands messages to the loop through
``call_soon_threadsafe``.

The worker never outlives its parent: end of stream on the socket, a changed parent
pid, or the kernel's parent-death signal (Linux ``PR_SET_PDEATHSIG``) each end it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from backends.base import (
    AdapterHost,
    AdapterSpec,
    Backend,
    BackendError,
    BackendEvent,
    GenerationRequest,
    InvalidRequest,
    NotReady,
    UnsupportedFeature,
)
from backends.embeddings import Embedder
from backends.process import protocol as p
from backends.scoring import Scorer
from backends.tokenizing import TextTokenizer

log = logging.getLogger("llmso.worker")

EXIT_OK = 0
EXIT_LOAD_ERROR = 1
EXIT_ENGINE_CRASHED = 3
# After SIGTERM the worker gets this long to stop its engine before it exits hard.
SHUTDOWN_GRACE_S = 10.0
PARENT_POLL_S = 1.0
_PR_SET_PDEATHSIG = 1

# Each whole call's protocol, and the param a model without it is refused on.
_ASKED: dict[str, tuple[type, str]] = {
    "embed": (Embedder, "input"),
    "score": (Scorer, "model"),
    "tokenize": (TextTokenizer, "model"),
    "detokenize": (TextTokenizer, "model"),
}

BackendClass = Callable[..., Backend]
"""A backend class named by ``module:Class``, built in the worker as
``Class(config, observer, on_crash)``."""


def load_factory(spec: str) -> BackendClass:
    """Import ``module:attr`` and return it; raises ``ValueError`` or ``ImportError``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"backend factory {spec!r} is not of the form 'module:Class'")
    factory: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        factory = getattr(factory, part)
    if not callable(factory):
        raise TypeError(f"backend factory {spec!r} is not callable")
    return factory  # type: ignore[no-any-return]


class Outbox:
    """Messages waiting to go to the parent, sent in batches by one writer task.

    Owned by the worker's event loop. ``put`` is loop-only; other threads use
    ``put_threadsafe``. Not bounded by count: every producer is a request stream that
    is itself bounded by ``max_tokens``, and the parent reads without back-pressure.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: list[p.Message] = []
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def put(self, message: p.Message) -> None:
        self._pending.append(message)
        self._wake.set()

    def put_threadsafe(self, message: p.Message) -> None:
        """``put`` from any thread; on the loop's own thread it skips the wake-up pipe."""
        if threading.get_ident() == self._loop_thread:
            self.put(message)
            return
        # The loop may already be closed while the engine thread winds down.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.put, message)

    async def run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                await self.flush()
        except (ConnectionError, OSError):
            return  # the parent is gone; the reader sees end of stream and ends the worker

    async def flush(self) -> None:
        self._wake.clear()
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self._writer.write(p.encode_frame(batch))
        await self._writer.drain()


class RelayObserver:
    """A ``WorkerObserver`` that forwards each call to the parent's metrics."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox

    def on_step(self, batch_size: int, num_tokens: int, seconds: float) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_step", (batch_size, num_tokens, seconds)))

    def on_load(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_load", (running, waiting, kv_cache_usage)))

    def on_abort(self) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_abort", ()))

    def on_preempt(self) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_preempt", ()))

    def on_newcomer_step(self) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_newcomer_step", ()))

    def on_step_error(self) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_step_error", ()))

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        self._outbox.put_threadsafe((p.OBSERVE, "on_prefix_cache", (queried_tokens, hit_tokens)))


class Worker:
    """One engine behind one socket. Owned by the worker's event loop."""

    def __init__(self, reader: asyncio.StreamReader, outbox: Outbox, parent_pid: int) -> None:
        self._reader = reader
        self._outbox = outbox
        self._parent_pid = parent_pid
        self._backend: Backend | None = None
        self._started = False
        self._requests: dict[int, asyncio.Task[None]] = {}
        self._calls: set[asyncio.Task[None]] = set()
        self._done = asyncio.Event()
        self._exit_code = EXIT_OK
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def request_exit(self, why: str, code: int = EXIT_OK) -> None:
        if not self._done.is_set():
            log.info("worker exiting: %s", why)
            self._exit_code = code
            self._done.set()

    async def run(self) -> int:
        first = await p.read_frame(self._reader)
        if not first or first[0][0] != p.INIT:
            log.error("expected an init message first, got %r", first)
            return EXIT_LOAD_ERROR
        _, config, spec = first[0]
        reader_task = asyncio.create_task(self._read_loop(), name="worker-reader")
        parent_task = asyncio.create_task(self._watch_parent(), name="worker-parent-watch")
        try:
            if not await self._load(config, spec):
                return EXIT_LOAD_ERROR
            await self._done.wait()
            return self._exit_code
        finally:
            reader_task.cancel()
            parent_task.cancel()
            await self._shutdown()

    async def _load(self, config: Any, spec: str) -> bool:
        """Build and start the engine; False (after telling the parent) if it failed."""
        try:
            factory = load_factory(spec)
            self._backend = factory(
                config, RelayObserver(self._outbox), on_crash=self._on_engine_crash
            )
            start = asyncio.create_task(self._backend.start(), name="engine-start")
            stop_wait = asyncio.create_task(self._done.wait())
            await asyncio.wait({start, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            if not start.done():
                start.cancel()
                return False
            start.result()
        except Exception as exc:
            log.exception("engine failed to start")
            self._outbox.put((p.LOAD_ERROR, f"{type(exc).__name__}: {exc}"))
            await self._outbox.flush()
            return False
        self._started = True
        self._outbox.put((p.READY, self._backend.info(), os.getpid()))
        return True

    async def _shutdown(self) -> None:
        for task in list(self._requests.values()):
            task.cancel()
        if self._requests:
            await asyncio.wait(list(self._requests.values()), timeout=SHUTDOWN_GRACE_S)
        if self._backend is not None and self._started:
            try:
                await asyncio.wait_for(self._backend.stop(), SHUTDOWN_GRACE_S)
            except Exception:
                log.exception("engine did not stop cleanly")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._outbox.flush(), 1.0)

    def _on_engine_crash(self, reason: str) -> None:
        """The engine's ``on_crash``; tolerated from any thread, though meant for the loop."""
        if threading.get_ident() != self._loop_thread:
            self._loop.call_soon_threadsafe(self._on_engine_crash, reason)
            return
        self._outbox.put((p.CRASHED, reason))
        self.request_exit(f"engine crashed: {reason}", EXIT_ENGINE_CRASHED)

    async def _watch_parent(self) -> None:
        while True:
            if os.getppid() != self._parent_pid:
                self.request_exit("parent process is gone")
                return
            await asyncio.sleep(PARENT_POLL_S)

    async def _read_loop(self) -> None:
        try:
            while (batch := await p.read_frame(self._reader)) is not None:
                for message in batch:
                    self._dispatch(message)
        except p.ProtocolError as exc:
            log.error("bad frame from parent: %s", exc)
        except (ConnectionError, OSError):
            pass
        self.request_exit("parent closed the channel")

    def _dispatch(self, message: p.Message) -> None:
        tag = message[0]
        if tag == p.GENERATE:
            _, key, request = message
            task = asyncio.create_task(self._serve(key, request), name=f"request-{key}")
            self._requests[key] = task
        elif tag == p.ASK:
            _, key, method, request = message
            task = asyncio.create_task(self._ask(key, method, request), name=f"{method}-{key}")
            self._requests[key] = task
        elif tag == p.CANCEL:
            running = self._requests.get(message[1])
            if running is not None:
                running.cancel()
        elif tag == p.CALL:
            _, call_id, name, arg = message
            call = asyncio.create_task(self._answer(call_id, name, arg), name=f"call-{name}")
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        elif tag == p.STOP:
            self.request_exit("parent asked to stop")
        else:
            log.error("unknown message %r", tag)

    async def _answer(self, call_id: int, name: str, arg: object) -> None:
        value: object = None
        backend = self._backend
        try:
            if name == "ready":
                value = self._started and backend is not None and await backend.ready()
            elif not isinstance(backend, AdapterHost):
                raise InvalidRequest("this model serves no LoRA adapters", param="model")
            elif name == "add_adapter" and isinstance(arg, AdapterSpec):
                await backend.add_adapter(arg)
            elif name == "remove_adapter" and isinstance(arg, str):
                await backend.remove_adapter(arg)
        except BackendError as exc:
            value = p.encode_error(exc)
        self._outbox.put((p.REPLY, call_id, value))

    async def _serve(self, key: int, request: GenerationRequest) -> None:
        """Relay one request's events; a cancel from the parent closes the engine's stream."""

        async def relay(backend: Backend) -> p.Message:
            events: AsyncIterator[BackendEvent] = backend.generate(request)
            try:
                async for event in events:
                    self._outbox.put((p.EVENT, key, p.encode_event(event)))
            finally:
                aclose = getattr(events, "aclose", None)
                if aclose is not None:
                    await aclose()
            return (p.END, key)

        await self._answer_request(key, f"request {request.request_id}", relay)

    async def _ask(self, key: int, method: str, request: Any) -> None:
        """Answer one whole call (``protocol.ASKS``); a cancel from the parent cancels the
        engine's wait."""

        async def ask(backend: Backend) -> p.Message:
            kind, param = _ASKED.get(method, (type(None), "model"))
            if not isinstance(backend, kind):
                raise UnsupportedFeature(f"this model does not serve {method}", param=param)
            return (p.ANSWER, key, await getattr(backend, method)(request))

        await self._answer_request(key, f"{method} {request.request_id}", ask)

    async def _answer_request(
        self, key: int, what: str, work: Callable[[Backend], Awaitable[p.Message]]
    ) -> None:
        """Run ``work`` on the engine and send its closing message, or the error it raised
        as ``ERROR``; a cancellation (the parent's ``CANCEL``) ends it silently."""
        try:
            if self._backend is None or not self._started:
                raise NotReady("engine is not started")
            closing = await work(self._backend)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not isinstance(exc, BackendError):
                log.exception("%s failed", what)
            self._outbox.put((p.ERROR, key, p.encode_error(exc)))
        else:
            self._outbox.put(closing)
        finally:
            self._requests.pop(key, None)


def _set_parent_death_signal() -> None:
    """Ask Linux to SIGTERM us when the parent dies, even if our loop is stuck."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _exit_hard_later(seconds: float) -> None:
    """A last resort after SIGTERM: if shutdown hangs (engine stuck in C code), exit."""
    timer = threading.Timer(seconds, os._exit, args=(EXIT_OK,))
    timer.daemon = True
    timer.start()


async def serve(fd: int, parent_pid: int) -> int:
    os.set_inheritable(fd, False)  # grandchildren must not keep the channel open
    sock = socket.socket(fileno=fd)
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    outbox = Outbox(writer)
    writer_task = asyncio.create_task(outbox.run(), name="worker-writer")
    worker = Worker(reader, outbox, parent_pid)
    loop = asyncio.get_running_loop()

    def on_sigterm() -> None:
        _exit_hard_later(SHUTDOWN_GRACE_S + 2.0)
        worker.request_exit("SIGTERM")

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await worker.run()
    finally:
        writer_task.cancel()
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.process.worker")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the parent")
    parser.add_argument("--parent-pid", type=int, required=True, help="exit when it is gone")
    parser.add_argument("--name", default="model", help="model name, for log lines")
    args = parser.parse_args(argv)
    _set_parent_death_signal()
    if os.getppid() != args.parent_pid:
        return EXIT_OK  # the parent died before the death signal was armed
    # The gateway owns Ctrl-C; the worker stops when its parent tells it to.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=os.environ.get("LLMSO_WORKER_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s worker[{args.name} pid={os.getpid()}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(serve(args.fd, args.parent_pid))


if __name__ == "__main__":
    sys.exit(main())
