"""The response store shared by several gateway replicas: Redis (or a compatible server).

Each entry is one key ``llmso:response:<id>`` holding the entry's bytes with a TTL, so
Redis expires them; its own ``maxmemory`` policy bounds the total. Every call has a
timeout; a store that does not answer is a 503, never a hang.

A pooled connection that outlived a Redis restart fails on its next use ("Connection
closed by server"), seconds after Redis is back: the 60-minute soak met 51 such 503s.
Every call here is idempotent (GET, SET or DEL of one key), so a connection error is
retried once, on a fresh connection, before it becomes a 503.
"""

from __future__ import annotations

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from gateway.api.responses.store import StoredResponse, StoreUnavailable

KEY_PREFIX = "llmso:response:"


class RedisResponseStore:
    """Owns one Redis connection pool for the app's lifetime."""

    def __init__(self, url: str, *, ttl: float, timeout: float) -> None:
        self._ttl_ms = max(1, int(ttl * 1000))
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )

    async def get(self, response_id: str) -> StoredResponse | None:
        try:
            data = await self._client.get(KEY_PREFIX + response_id)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from None
        if data is None:
            return None
        return StoredResponse.decode(data if isinstance(data, bytes) else data.encode())

    async def put(self, response_id: str, entry: StoredResponse) -> None:
        try:
            await self._client.set(KEY_PREFIX + response_id, entry.encode(), px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from None

    async def delete(self, response_id: str) -> bool:
        try:
            removed: int = await self._client.delete(KEY_PREFIX + response_id)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"response store unavailable: {exc}") from None
        return removed > 0

    async def close(self) -> None:
        await self._client.aclose()
