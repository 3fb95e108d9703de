"""``SlotGate``: at most ``max_concurrency`` requests in flight to the upstream; more wait
a bounded time in a bounded line, else ``Overloaded``. Owned by the backend's event loop."""

from __future__ import annotations

import asyncio

from backends.base import Overloaded
from config.schema import OpenAIModelConfig


class SlotGate:
    """``take`` one slot, ``free`` it. Two methods, not an ``@asynccontextmanager``: one is
    taken per request, and a generator-based context costs several times more."""

    __slots__ = ("_config", "_slots", "_waiting")

    def __init__(self, config: OpenAIModelConfig) -> None:
        self._config = config
        self._slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
        self._waiting = 0

    async def take(self) -> None:
        """Hold one slot; wait at most ``queue_timeout`` behind at most ``max_queue``."""
        slots = self._slots
        if slots is None:
            return
        if not slots.locked():
            await slots.acquire()
            return
        config = self._config
        if self._waiting >= config.max_queue:
            raise Overloaded(f"model {config.name!r}: too many waiting requests")
        self._waiting += 1
        try:
            async with asyncio.timeout(config.queue_timeout):
                await slots.acquire()
        except TimeoutError:
            raise Overloaded(
                f"model {config.name!r}: no free upstream slot within {config.queue_timeout:g}s"
            ) from None
        finally:
            self._waiting -= 1

    def free(self) -> None:
        if self._slots is not None:
            self._slots.release()
