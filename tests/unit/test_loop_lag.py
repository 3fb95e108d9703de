"""``gateway.observe.loop_lag``: how late the event loop runs, and when that counts as
shed for: a sustained backlog (most wakes late), not one long pause, in proportion."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.observe.loop_lag import LoopLag


async def _run_for(lag: LoopLag, seconds: float) -> None:
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(seconds)
    task.cancel()


async def test_an_idle_loop_is_on_time() -> None:
    seen: list[float] = []
    # A generous limit: a busy test machine may wake a timer a few ms late.
    lag = LoopLag(0.1, interval=0.01, observe=seen.append)
    await _run_for(lag, 0.2)
    assert len(seen) >= 8
    assert lag.seconds < 0.1 and lag.share == 0


async def test_a_loop_held_at_every_turn_is_lagging() -> None:
    lag = LoopLag(0.02, interval=0.01)
    task = asyncio.create_task(lag.run())
    for _ in range(12):
        time.sleep(0.04)  # noqa: ASYNC251 - the point: the loop is held
        await asyncio.sleep(0)
    task.cancel()
    assert lag.seconds > 0.02 and lag.share > 0


async def test_one_long_pause_is_not_lagging() -> None:
    lag = LoopLag(0.1, interval=0.01)  # the pause is three times the limit
    task = asyncio.create_task(lag.run())
    await asyncio.sleep(0.1)
    time.sleep(0.3)  # noqa: ASYNC251 - one blocking call (a collection, a big parse)
    await asyncio.sleep(0.05)
    task.cancel()
    assert max(lag._notes) > 0.2  # the pause was noted, as one note
    assert lag.share == 0


def test_the_median_of_the_window_decides_the_share() -> None:
    lag = LoopLag(0.05, window=4)
    for late in (0.0, 0.2, 0.0, 0.2):
        lag.note(late)
    assert lag.seconds == 0.1 and lag.share == 1.0  # twice the limit: every new request
    lag.note(0.0)  # 0.2, 0.0, 0.2, 0.0: still a median of 0.1
    assert lag.share == 1.0
    lag.note(0.06)  # 0.0, 0.2, 0.0, 0.06: a median of 0.03, under the limit
    assert lag.seconds == 0.03 and lag.share == 0.0
    for late in (0.075, 0.075, 0.075):
        lag.note(late)  # 0.06, 0.075, 0.075, 0.075: half past the limit
    assert lag.seconds == 0.075 and lag.share == pytest.approx(0.5)
    lag.note(-0.001)  # an early wake counts as on time
    assert lag.seconds == 0.075


def test_without_a_limit_it_measures_and_never_lags() -> None:
    lag = LoopLag(None, window=2)
    lag.note(1.0)
    lag.note(1.0)
    assert lag.seconds == 1.0 and lag.share == 0
