"""``send_frames``: frames ready together go out in one message, nothing is held back while
the producer waits, and a failed send, closing or cancelling reaches the producer as with
``async for``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from gateway.edge.sse_batch import send_frames
from gateway.service.chat_bodies import END_OF_FRAMES


class Client:
    """A recording ASGI ``send``; ``fail``: raise this on the next message."""

    def __init__(self, log: list[object] | None = None) -> None:
        self.log: list[object] = [] if log is None else log
        self.fail: BaseException | None = None
        self.stall: asyncio.Event | None = None
        self.sent = asyncio.Event()

    async def send(self, message: dict[str, Any]) -> None:
        assert message["type"] == "http.response.body"
        if self.fail is not None:
            raise self.fail
        if self.stall is not None:
            await self.stall.wait()
        self.log.append((message["body"], message["more_body"]))
        self.sent.set()

    def ending(self) -> None:
        self.log.append("ending")


async def _sent(frames: AsyncGenerator[bytes, None]) -> list[object]:
    client = Client()
    await send_frames(frames, client.send, client.ending)
    return client.log


async def test_frames_ready_at_once_are_one_last_message() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        for i in range(5):
            yield b"%d" % i

    assert await _sent(frames()) == ["ending", (b"01234", False)]


async def test_a_wait_splits_messages_and_the_ready_ones_go_out_first() -> None:
    gate = asyncio.Event()
    log: list[object] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"role"
        yield b"first"
        await gate.wait()  # the upstream's next read
        log.append("resumed")
        yield b"finish"
        yield b"done"

    client = Client(log)
    task = asyncio.ensure_future(send_frames(frames(), client.send, client.ending))
    await client.sent.wait()
    assert log == [(b"rolefirst", True)]  # delivered while the producer still waits
    gate.set()
    await task
    assert log == [(b"rolefirst", True), "resumed", "ending", (b"finishdone", False)]


async def test_a_wait_at_the_end_gives_an_empty_last_message() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0.001)

    assert await _sent(frames()) == [(b"a", True), "ending", (b"", False)]


async def test_a_failed_send_while_the_producer_waits_runs_its_cleanup_with_awaits() -> None:
    cleaned: list[str] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"a"
            await asyncio.Event().wait()  # never set: a stalled upstream
            yield b"never"
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise
        finally:
            await asyncio.sleep(0)  # closing the backend stream awaits
            cleaned.append("finally")

    client = Client()
    client.fail = ConnectionResetError("gone")
    with pytest.raises(ConnectionResetError):
        await send_frames(frames(), client.send, client.ending)
    assert cleaned == ["cancelled", "finally"]


async def test_cancelled_in_a_send_ends_the_waiting_producer_and_what_it_awaits() -> None:
    """The producer waits inside another async generator (the service in the backend's
    stream): a client gone during a send ends both, each running its cleanup, and the
    inner one can still be closed (a ``GeneratorExit`` thrown in would have left it
    "already running": ``aclose()`` then raises)."""
    cleaned: list[str] = []

    async def upstream() -> AsyncGenerator[str, None]:
        try:
            yield "token"
            await asyncio.Event().wait()
            yield "never"
        finally:
            cleaned.append("upstream closed")

    events = upstream()

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            async for event in events:
                yield event.encode()
        finally:
            await events.aclose()
            cleaned.append("producer closed")

    client = Client()
    client.stall = asyncio.Event()  # a slow client: the send waits for the socket
    task = asyncio.ensure_future(send_frames(frames(), client.send, client.ending))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["upstream closed", "producer closed"]
    await events.aclose()  # finished, not "already running"


async def test_cancelling_the_sender_cancels_the_waiting_producer() -> None:
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

    task = asyncio.ensure_future(_sent(frames()))
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

    assert await _sent(frames()) == [(b"a", True), "ending", (b"timed out", False)]


async def test_a_producer_error_propagates_after_the_ready_frames() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0)
        raise ValueError("boom")

    client = Client()
    with pytest.raises(ValueError, match="boom"):
        await send_frames(frames(), client.send, client.ending)
    assert client.log == [(b"a", True)]


async def test_an_empty_frame_ends_the_body_before_the_producer_cleans_up() -> None:
    log: list[object] = []

    async def frames() -> AsyncGenerator[bytes, None]:
        try:
            yield b"a"
            yield b"[DONE]"
            yield END_OF_FRAMES
            yield b"dropped"
        finally:
            log.append("cleanup")

    client = Client(log)
    await send_frames(frames(), client.send, client.ending)
    assert log == ["ending", (b"a[DONE]", False), "cleanup"]


async def test_an_end_right_after_a_wait_is_an_empty_last_message() -> None:
    async def frames() -> AsyncGenerator[bytes, None]:
        yield b"a"
        await asyncio.sleep(0)
        yield END_OF_FRAMES

    assert await _sent(frames()) == [(b"a", True), "ending", (b"", False)]
