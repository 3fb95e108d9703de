"""Group the SSE frames that are ready at the same moment, so the edge sends them in one
``send`` (one chunk, one ``write`` syscall) instead of one each.

A stream's frames come from an async generator (``CompletionService.stream``) that
produces several frames per upstream read or engine step: the role chunk and the first
delta together, then a finish chunk, the usage chunk and ``[DONE]`` together. Whether the
next frame is ready is only known by running the generator: ``ready_batches`` steps it
by hand and, the moment a step would suspend (it yielded a future to the event loop),
hands out what it has so far, then lets the event loop resume that same step. No frame
is ever held back while the producer waits, so latency is unchanged; only syscalls (and
the server's per-``send`` work) go away.

The step left suspended across the hand-out is driven by ``_Resume``, which forwards
everything the event loop sends or throws (cancellation included) to it, so timeouts,
disconnects and ``aclose()`` behave exactly as with a plain ``async for``.
``ready_batches`` is owned by the one task serving its stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Generator
from typing import Any


class _Resume:
    """Awaitable that continues an ``__anext__`` step which already yielded ``pending``."""

    __slots__ = ("_pending", "_step", "_throw")

    def __init__(self, step: Any, pending: Any, throw: BaseException | None = None) -> None:
        self._step = step
        self._pending = pending
        self._throw = throw

    def __await__(self) -> Generator[Any, Any, Any]:
        step = self._step
        value = self._pending
        error = self._throw
        try:
            if error is not None:
                value = step.throw(error)
            while True:
                try:
                    sent = yield value
                except BaseException as exc:  # the loop's cancellation, forwarded as is
                    value = step.throw(exc)
                else:
                    value = step.send(sent)
        except StopIteration as done:
            return done.value


async def ready_batches(
    frames: AsyncGenerator[bytes, None],
) -> AsyncGenerator[tuple[list[bytes], bool], None]:
    """``(frames ready together, is last)`` for the frames of ``frames``, in order; a batch
    is never empty, and ``is last`` is True when ``frames`` ended right after it (so the
    edge can end the body in the same send), False when that is not known yet.

    Closing this generator closes ``frames`` (also when a step of it is suspended)."""
    batch: list[bytes] = []
    try:
        while True:
            step = frames.__anext__()
            try:
                pending = step.send(None)
            except StopIteration as done:  # ready without waiting
                batch.append(done.value)
                continue
            except StopAsyncIteration:
                break
            # The producer would wait: hand out what is ready, then wait with it.
            if batch:
                ready, batch = batch, []
                try:
                    yield ready, False
                except BaseException as exc:  # closed (client gone) while the step waits
                    with contextlib.suppress(StopAsyncIteration):
                        await _Resume(step, None, throw=exc)
                    raise
            try:
                batch.append(await _Resume(step, pending))
            except StopAsyncIteration:
                break
        if batch:
            yield batch, True
    finally:
        await frames.aclose()
