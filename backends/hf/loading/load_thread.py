"""Run one blocking call on a thread of its own, which exits when the call returns
(``run_in_own_thread`` from a coroutine, ``call_in_own_thread`` from plain code).

Why not ``asyncio.to_thread`` for the model load: its executor threads live on, and a
thread that ran torch work on more than one core keeps a GNU OpenMP pool of idle workers
for as long as it lives. libgomp counts every pool's threads; once they outnumber the
CPUs it cuts every team's spin-wait to a token count, so the engine thread's hundreds of
parallel regions per step each wake their workers through the kernel. Measured on a
2-vCPU AMD EPYC (docs/hf_profile.md): a 1-row SmolLM2 bf16 decode step took 31.5 ms
with the runner built on an executor thread, 21.8 ms with it built on a thread that
exited. A thread that exits frees its pool.

Stateless; each call owns its thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def run_in_own_thread(fn: Callable[[], T], name: str) -> T:
    """``fn()`` on a new thread; returns (or raises) what it did once that thread is gone."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():  # the awaiting task was cancelled
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result = fn()
        except BaseException as error:  # handed to the awaiting task, not lost
            loop.call_soon_threadsafe(settle, None, error)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    try:
        return await done
    finally:
        # The pool goes with the thread: wait for it to exit, unless the caller was
        # cancelled (then the call runs on unawaited, as with ``asyncio.to_thread``).
        if not done.cancelled():
            await asyncio.to_thread(thread.join)


def call_in_own_thread(fn: Callable[[], T], name: str) -> T:
    """``fn()`` on a new thread, joined before returning (or re-raising) what it did."""
    results: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            results.append(fn())
        except BaseException as error:  # re-raised on the caller's thread
            errors.append(error)

    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]
