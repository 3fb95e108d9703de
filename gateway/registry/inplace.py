"""Replica changes applied to a running backend on hot reload (no restart), and the
running backend's replica status for the admin API.

Owned by ``Lifecycle`` (the model table's only writer), on the event loop: it calls
``reconfigure_replicas`` for a model whose new config differs from the running one only
in fields the registry applies in place (``diff.IN_PLACE_FIELDS``, ``REPLICA_FIELDS``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from backends.replicas.live import LiveReplicas
from config.schema import ModelConfig
from gateway.registry.diff import replicas_changed
from gateway.registry.entry import Entry, Instance

log = logging.getLogger("llmso.registry")


def update_in_place(
    entries: Mapping[str, Entry], names: Iterable[str], configs: Mapping[str, ModelConfig]
) -> list[str]:
    """Give each named entry its new config (a change the registry applies in place);
    returns the names whose backend could not take its replica change (restart them)."""
    restart = []
    for name in names:
        entries[name].config = configs[name]
        if not reconfigure_replicas(entries[name]):
            restart.append(name)
    return restart


def reconfigure_replicas(entry: Entry) -> bool:
    """Move the entry's running backend onto ``entry.config``'s replica list and balance
    settings: added replicas join, removed ones drain (no new requests; those in flight
    finish). The instance then counts as started from the new config. False when the
    backend cannot (it has no live replica set): the caller restarts it instead."""
    instance = entry.instance
    if instance is None or instance.stopped or not replicas_changed(instance.config, entry.config):
        return True
    backend = instance.backend
    if not isinstance(backend, LiveReplicas):
        return False
    backend.reconfigure(entry.config)
    instance.config = entry.config
    log.info("model %s: replicas updated in place", entry.name)
    return True


def replica_status(instance: Instance | None) -> tuple[dict[str, object], ...]:
    """The running backend's per-replica health and load, for the admin API."""
    if instance is None or instance.crashed or not isinstance(instance.backend, LiveReplicas):
        return ()
    return tuple(instance.backend.replica_status())
