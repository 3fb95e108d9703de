"""Logging set-up: one JSON object per line by default, so request logs are machine-read.

Request lines (logger ``llmso.requests``, one per request) are written in batches: the
first one waits at most ``REQUEST_LINES_FLUSH_S`` on the event loop for others to join
it, as nginx's ``access_log ... buffer= flush=`` does. One ``write`` per request was
~2 % of the gateway's CPU per streamed request. Every other record is written at once,
after the request lines pending before it, so order is kept; shutdown flushes what is
pending (``logging.shutdown``). A process killed outright loses at most that window.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TextIO

import orjson

REQUEST_LOGGER = "llmso.requests"
REQUEST_LINES_FLUSH_S = 0.05
_MAX_PENDING_LINES = 512


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == REQUEST_LOGGER and message.startswith("{"):
            return message  # already a complete JSON object
        payload: dict[str, object] = {
            "ts": round(time.time(), 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": message,
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(payload).decode()


class BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A ``StreamHandler`` that batches request lines; see the module docstring.

    ``_pending`` and ``_timer_loop`` are guarded by the handler's lock (``Handler.handle`` holds
    it around ``emit``; ``flush`` takes it). A timer is armed only from a thread running an
    event loop; a request line logged anywhere else is written at once."""

    def __init__(self, stream: TextIO, flush_after: float = REQUEST_LINES_FLUSH_S) -> None:
        super().__init__(stream)
        self._flush_after = flush_after
        self._pending: list[str] = []
        self._timer_loop: asyncio.AbstractEventLoop | None = None  # a flush is due on it

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pending.append(self.format(record) + self.terminator)
            if (
                record.name == REQUEST_LOGGER
                and len(self._pending) < _MAX_PENDING_LINES
                and self._arm()
            ):
                return
            self._write()
        except Exception:
            self.handleError(record)

    def _arm(self) -> bool:
        """Whether a flush is due on an event loop (armed now or before). A loop that was
        closed before its flush ran will not run it: arm anew (or write at once)."""
        due_on = self._timer_loop
        if due_on is not None and not due_on.is_closed():
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        loop.call_later(self._flush_after, self._due)
        self._timer_loop = loop
        return True

    def _due(self) -> None:
        # Never cancelled: one that finds nothing pending (flushed meanwhile) is a no-op,
        # and a closed loop (shutdown flushes) is never touched again.
        with self.lock:  # type: ignore[union-attr]
            self._timer_loop = None
            self._write()

    def _write(self) -> None:
        if self._pending:
            text = "".join(self._pending)
            self._pending.clear()
            self.stream.write(text)
            self.stream.flush()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()


def configure_logging(level: str, fmt: str) -> None:
    handler = BatchingStreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    _lean_records()


def _lean_records() -> None:
    """Skip what no formatter here prints: the caller's file and line (a stack walk per
    record), thread, process and multiprocessing names. The logging HOWTO's
    "Optimization" section names these switches; every request writes one log line, so
    they were ~1 % of the gateway's CPU per streamed request."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None
