"""``ready_batches``: frames ready together come out together, nothing is held back while
the producer waits, and closing or cancelling reaches the producer as with ``async for``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from gateway.edge.sse_batch import ready_batches
from gateway.service.chat_bodies import END_OF_FRAMES


async def _collect(frames: AsyncGenerator[bytes, None]) -> list[tuple[list[bytes], bool]]:
    return [batch async for batch in ready_batches(frames)]


async def test_frames_ready_at_once_are_one_last_batch() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        for i in range(5):
            yield b"%d" % i

    assert await _collect(frames()) == [([b"0", b"1", b"2", b"3", b"4"], True)]


async def test_a_wait_splits_batches_and_the_ready_ones_go_out_first() -> None:
    gate = asyncio.Event()
    seen: list[object] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"role"
        yield b"first"
        await gate.wait()  # the upstream's next read
        seen.append("resumed")
        yield b"finish"
        yield b"done"

    batches = ready_batches(frames())
    first = await anext(batches)
    seen.append(first)  # delivered while the producer still waits on the gate
    gate.set()
    rest = [batch async for batch in batches]
    assert seen == [([b"role", b"first"], False), "resumed"]
    assert rest == [([b"finish", b"done"], True)]


async def test_a_wait_at_the_end_gives_an_unknown_last_batch() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0.001)

    assert await _collect(frames()) == [([b"a"], False)]


async def test_closing_while_the_producer_waits_runs_its_cleanup_with_awaits() -> None:
    cleaned: list[str] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"a"
            await asyncio.Event().wait()  # never set: a stalled upstream
            yield b"never"
        except GeneratorExit:
            cleaned.append("exit")
            raise
        finally:
            await asyncio.sleep(0)  # closing the backend stream awaits
            cleaned.append("finally")

    batches = ready_batches(frames())
    assert await anext(batches) == ([b"a"], False)
    await batches.aclose()
    assert cleaned == ["exit", "finally"]


async def test_cancelling_the_consumer_cancels_the_waiting_producer() -> None:
    cancelled: list[str] = []
    started = asyncio.Event()

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            started.set()
            await asyncio.Event().wait()
            yield b"never"
        except asyncio.CancelledError:
            cancelled.append("producer")
            raise

    task = asyncio.ensure_future(_collect(frames()))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled == ["producer"]


async def test_a_timeout_inside_the_producer_still_fires() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        try:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
        except TimeoutError:
            yield b"timed out"

    assert await _collect(frames()) == [([b"a"], False), ([b"timed out"], True)]


async def test_a_producer_error_propagates_after_the_ready_frames() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0)
        raise ValueError("boom")

    batches = ready_batches(frames())
    assert await anext(batches) == ([b"a"], False)
    with pytest.raises(ValueError, match="boom"):
        await anext(batches)


async def test_an_empty_frame_ends_the_output_before_the_producer_cleans_up() -> None:
    order: list[str] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"a"
            yield b"[DONE]"
            yield END_OF_FRAMES
            yield b"dropped"
        finally:
            order.append("cleanup")

    batches = ready_batches(frames())
    assert await anext(batches) == ([b"a", b"[DONE]"], True)
    order.append("sent")
    assert [batch async for batch in batches] == []
    assert order == ["sent", "cleanup"]


async def test_an_end_right_after_a_wait_is_an_empty_last_batch() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0)
        yield END_OF_FRAMES

    assert await _collect(frames()) == [([b"a"], False), ([], True)]
