"""Which response store a config names: the process's own, or the Redis one replicas
share. Apart from ``store`` so the memory store's module never imports the Redis one."""

from __future__ import annotations

from config.schema import ResponsesConfig
from gateway.api.responses.store import MemoryResponseStore, ResponseStore


def open_store(config: ResponsesConfig, default: str = "memory") -> ResponseStore:
    """The store ``config`` names, else ``default`` (the limits store's URL, so gateways
    that share limits share conversations too); connects lazily (no I/O here)."""
    where = config.store or default
    if where == "memory":
        return MemoryResponseStore(config.max_entries, config.ttl)
    # Imported only when named: a gateway without Redis never loads its client.
    from gateway.api.responses.redis_store import RedisResponseStore

    return RedisResponseStore(where, ttl=config.ttl, timeout=config.timeout)
