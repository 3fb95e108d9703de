"""Where finished responses are kept so ``previous_response_id`` can continue them.

A stored entry is the response object (for ``GET /v1/responses/{id}``) together with the
whole conversation it ended (history, its own input and its output, as Responses items),
so a follow-up request reads one entry, never a chain. Entries are kept as orjson bytes:
nobody can mutate what another request reads, and the Redis store holds the same bytes.

``MemoryResponseStore`` serves one process (bounded LRU, entries expire after ``ttl``);
``RedisResponseStore`` (``gateway.api.responses.redis_store``) is shared by replicas.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from backends.errors import ApiError


class ResponseNotFound(ApiError):
    status = 404
    error_type = "invalid_request_error"
    code = "response_not_found"


class StoreUnavailable(ApiError):
    """The shared response store did not answer in time."""

    status = 503
    error_type = "service_unavailable"
    code = "response_store_unavailable"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    items: list[dict[str, Any]]

    def encode(self) -> bytes:
        return orjson.dumps({"response": self.response, "items": self.items})

    @staticmethod
    def decode(data: bytes) -> StoredResponse:
        raw = orjson.loads(data)
        return StoredResponse(response=raw["response"], items=raw["items"])


class ResponseStore(Protocol):
    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def put(self, response_id: str, entry: StoredResponse) -> None: ...

    async def delete(self, response_id: str) -> bool: ...

    async def close(self) -> None: ...


class MemoryResponseStore:
    """LRU of at most ``max_entries`` entries, each expiring ``ttl`` seconds after it was
    written. Owned by the app's event loop; no locks needed (no awaits inside)."""

    def __init__(
        self, max_entries: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_entries = max_entries
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, response_id: str) -> StoredResponse | None:
        found = self._entries.get(response_id)
        if found is None:
            return None
        expires, data = found
        if expires <= self._clock():
            del self._entries[response_id]
            return None
        self._entries.move_to_end(response_id)
        return StoredResponse.decode(data)

    async def put(self, response_id: str, entry: StoredResponse) -> None:
        self._entries[response_id] = (self._clock() + self._ttl, entry.encode())
        self._entries.move_to_end(response_id)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    async def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    async def close(self) -> None:
        self._entries.clear()
