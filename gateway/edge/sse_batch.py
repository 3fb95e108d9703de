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

The step left suspended across the hand-out is driven by ``gateway.edge.stepping.Resume``,
which forwards everything the event loop sends or throws (cancellation included) to it,
so timeouts, disconnects and ``aclose()`` behave exactly as with a plain ``async for``.
``ready_batches`` is owned by the one task serving its stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from gateway.edge.stepping import Resume


async def ready_batches(
    frames: AsyncGenerator[bytes, None],
) -> AsyncGenerator[tuple[list[bytes], bool], None]:
    """``(frames ready together, is last)`` for the frames of ``frames``, in order.

    ``is last`` is True when nothing more will follow, so the edge ends the body in the
    same send: ``frames`` ended right after the batch, or yielded an empty frame (the
    producer's "that was all", ``gateway.service.chat_bodies.END_OF_FRAMES``; the batch is then
    handed out at once, and the producer's cleanup runs on the next step). A batch is
    never empty unless it is the last. Frames after an empty one are dropped.

    Closing this generator closes ``frames`` (also when a step of it is suspended)."""
    batch: list[bytes] = []
    ended = False
    try:
        while True:
            step = frames.__anext__()
            try:
                pending = step.send(None)
            except StopIteration as done:  # ready without waiting
                frame = done.value
            except StopAsyncIteration:
                break
            else:
                # The producer would wait: hand out what is ready, then wait with it.
                if batch:
                    ready, batch = batch, []
                    try:
                        yield ready, False
                    except BaseException as exc:  # closed (client gone) while it waits
                        with contextlib.suppress(StopAsyncIteration):
                            await Resume(step, None, throw=exc)
                        raise
                try:
                    frame = await Resume(step, pending)
                except StopAsyncIteration:
                    break
            if ended:
                continue
            if frame:
                batch.append(frame)
                continue
            ended = True
            ready, batch = batch, []
            yield ready, True
        if batch:
            yield batch, True
    finally:
        await frames.aclose()
