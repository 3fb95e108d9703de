"""What a backend with a live ``ReplicaSet`` offers the registry and the admin API."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class LiveReplicas(Protocol):
    """A backend whose replica list and balance settings change without a restart."""

    def reconfigure(self, config: Any) -> None:
        """Apply a config that differs from the running one only in replica fields
        (``gateway.registry.diff.REPLICA_FIELDS``): added replicas join, removed ones
        drain."""
        ...

    def replica_status(self) -> list[dict[str, object]]:
        """Per replica: url, up, ejected, draining, in-flight, scraped load."""
        ...
