"""``run_in_own_thread``: result and error come back, and the thread is gone by then
(its effect on the engine's step time is measured in docs/hf_profile.md, not timed here)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from backends.hf.loading.load_thread import call_in_own_thread, run_in_own_thread


async def test_returns_the_result_after_the_thread_exited() -> None:
    seen: list[str] = []

    def work() -> int:
        seen.append(threading.current_thread().name)
        return 42

    assert await run_in_own_thread(work, "own-test") == 42
    assert seen == ["own-test"]
    assert all(t.name != "own-test" for t in threading.enumerate())


async def test_raises_what_the_call_raised() -> None:
    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await run_in_own_thread(fail, "own-fail")


async def test_cancelling_the_caller_does_not_wait_for_the_call() -> None:
    release = threading.Event()
    task = asyncio.create_task(run_in_own_thread(release.wait, "own-slow"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5.0)
    release.set()


def test_call_in_own_thread_returns_or_raises_on_the_caller_thread() -> None:
    caller = threading.get_ident()
    ran_on: list[int] = []

    def work() -> int:
        ran_on.append(threading.get_ident())
        return 7

    assert call_in_own_thread(work, "t") == 7
    assert ran_on and ran_on[0] != caller

    def fails() -> None:
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        call_in_own_thread(fails, "t")
