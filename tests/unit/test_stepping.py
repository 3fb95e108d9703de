"""``gateway.edge.stepping.first_step``: a ready awaitable costs no wait, a pending one is
resumed exactly as a plain ``await`` would be (results, errors, cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.edge.stepping import first_step


async def _ready() -> str:
    return "now"


async def _later(event: asyncio.Event) -> str:
    await event.wait()
    return "later"


async def _fails(event: asyncio.Event) -> str:
    await event.wait()
    raise ValueError("upstream")


async def test_a_ready_awaitable_gives_its_result_without_a_resume() -> None:
    assert first_step(_ready()) == ("now", None)


async def test_a_pending_awaitable_is_resumed_to_its_result() -> None:
    event = asyncio.Event()
    result, rest = first_step(_later(event))
    assert result is None and rest is not None
    asyncio.get_running_loop().call_soon(event.set)
    assert await rest == "later"


async def test_an_error_after_the_wait_reaches_the_awaiter() -> None:
    event = asyncio.Event()
    _, rest = first_step(_fails(event))
    assert rest is not None
    event.set()
    with pytest.raises(ValueError, match="upstream"):
        await rest


async def test_a_timeout_cancels_the_step_it_resumes() -> None:
    seen: list[str] = []

    async def waits() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    _, rest = first_step(waits())
    assert rest is not None
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await rest
    assert seen == ["cancelled"]
