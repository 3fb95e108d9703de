"""Helpers for the registry's tasks: joining shared loads and drains, and getting a
backend's callback onto the event loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


async def join(task: asyncio.Task[None]) -> None:
    """Wait for a shared task without cancelling it when we are cancelled, and without
    turning its cancellation (or failure) into ours."""
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        if being_cancelled() or not task.cancelled():
            raise
    except Exception as exc:
        log.debug("joined task %s failed: %s", task.get_name(), describe(exc))


def being_cancelled() -> bool:
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def on_this_loop(callback: Callable[[str], None]) -> Callable[[str], None]:
    """``callback`` as a crash handler: the contract says backends call it on the loop;
    one called from another thread hops over instead of touching loop-owned state."""
    loop = asyncio.get_running_loop()
    loop_thread = threading.get_ident()

    def handler(reason: str) -> None:
        if threading.get_ident() != loop_thread:
            loop.call_soon_threadsafe(handler, reason)
        else:
            callback(reason)

    return handler
