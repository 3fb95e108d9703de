"""The fleet's one wire: length-prefixed orjson frames over a UNIX socket, calls both ways.

A frame is a 4-byte big-endian length and an orjson array ``[kind, id, op, body]``:
``kind`` 0 is a call (``op`` names what to do, ``body`` its argument), 1 a reply to call
``id`` (``body`` the result), 2 a failed call (``body`` the error's text). Either end may
call the other: a worker asks the supervisor's hub to admit a request against its limits;
the hub asks every worker for its metrics. ``Channel`` serves one connection: ``call``
sends and awaits the reply; the reader task hands each call it receives to ``handler``
in a task of its own, so a slow call never holds up the replies behind it.

A ``Channel`` is owned by the event loop it was opened on. ``closed`` is set when the
peer goes away; every call waiting then fails with ``ChannelClosed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

log = logging.getLogger(__name__)

Handler = Callable[[str, Any], Awaitable[Any]]
"""Serves one call received: ``(op, body) -> result`` (JSON-able); an exception becomes
the caller's ``CallFailed``."""

_HEADER = struct.Struct(">I")
_CALL, _REPLY, _FAILED = 0, 1, 2
MAX_FRAME = 64 * 1024 * 1024
"""A frame larger than this is a broken peer, not a message: the channel closes."""


class ChannelClosed(ConnectionError):
    """The peer went away before answering."""


class CallFailed(Exception):
    """The peer's handler raised; the message is its ``Type: text``."""


class Channel:
    """One connection's calls, both ways. See the module docstring."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        *,
        name: str = "fleet",
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._handler = handler
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._serving: set[asyncio.Task[None]] = set()
        self.closed = asyncio.Event()
        self._task = asyncio.create_task(self._read(), name=f"{name}-reader")

    async def call(self, op: str, body: Any = None) -> Any:
        """Send ``op`` and wait for its reply; raises ``ChannelClosed`` or ``CallFailed``
        (the caller bounds the wait)."""
        if self.closed.is_set():
            raise ChannelClosed("fleet channel is closed")
        call_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        try:
            self._send(_CALL, call_id, op, body)
            return await future
        finally:
            self._waiting.pop(call_id, None)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for task in list(self._serving):
            task.cancel()
        self._shut()

    def _send(self, kind: int, call_id: int, op: str, body: Any) -> None:
        payload = orjson.dumps([kind, call_id, op, body])
        # One write: the transport buffers it whole, so frames never interleave.
        self._writer.write(_HEADER.pack(len(payload)) + payload)

    async def _read(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(_HEADER.size)
                (size,) = _HEADER.unpack(header)
                if size > MAX_FRAME:
                    log.error("fleet channel: a frame of %d bytes; closing", size)
                    return
                kind, call_id, op, body = orjson.loads(await self._reader.readexactly(size))
                if kind == _CALL:
                    task = asyncio.create_task(self._serve(call_id, op, body))
                    self._serving.add(task)
                    task.add_done_callback(self._serving.discard)
                else:
                    self._settle(kind, call_id, body)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        except ValueError as exc:  # not a frame of ours: the peer is broken
            log.error("fleet channel: unreadable frame (%s); closing", exc)
        finally:
            self._shut()

    def _settle(self, kind: int, call_id: int, body: Any) -> None:
        future = self._waiting.get(call_id)
        if future is None or future.done():
            return  # the caller gave up (timed out) already
        if kind == _REPLY:
            future.set_result(body)
        else:
            future.set_exception(CallFailed(body))

    async def _serve(self, call_id: int, op: str, body: Any) -> None:
        try:
            result = await self._handler(op, body)
        except Exception as exc:
            if not self.closed.is_set():
                self._send(_FAILED, call_id, op, f"{type(exc).__name__}: {exc}")
            return
        if not self.closed.is_set():
            try:
                self._send(_REPLY, call_id, op, result)
            except TypeError as exc:  # not JSON-able: the handler's bug, told to the caller
                self._send(_FAILED, call_id, op, f"TypeError: {exc}")

    def _shut(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ChannelClosed("fleet peer went away"))
        self._writer.close()
