"""Logging set-up: one JSON object per line by default, so request logs are machine-read."""

from __future__ import annotations

import logging
import sys
import time

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == "llmso.requests" and message.startswith("{"):
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


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
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
