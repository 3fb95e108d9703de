"""Pure comparison of two configs for hot reload."""

from __future__ import annotations

from config.schema import AppConfig, ModelConfig, ReplicatedModel
from gateway.registry.values import ConfigDiff

# Fields the registry applies in place: they change routing or lifecycle policy, not
# what the backend was started with, so the running backend can stay.
IN_PLACE_FIELDS = frozenset(
    {
        "aliases",
        "capabilities",
        "priority",
        "fallback",
        "idle_ttl",
        "load_timeout",
        "max_concurrency",
        "preload",
        "memory_bytes",
        "mirror",  # read per request (ModelRegistry.mirror_of)
    }
)


# The replica list and balance fields of a replicated model (openai, triton): the running
# backend applies them to its live ReplicaSet (``Lifecycle.apply``), without a restart.
REPLICA_FIELDS = frozenset(
    {
        "base_url",
        "url",
        "replicas",
        "metrics_port",
        "balance",
        "metrics_scrape_interval",
        "prefix_chars",
        "prefix_load_factor",
        "adapters",  # openai: routing to the upstream's adapters changes in place
        "load_adapters",
    }
)


def _in_place(old: ModelConfig, new: ModelConfig) -> set[str]:
    fields = set(IN_PLACE_FIELDS)
    if isinstance(old, ReplicatedModel) and type(old) is type(new):
        fields |= REPLICA_FIELDS
    return fields


def needs_restart(old: ModelConfig, new: ModelConfig) -> bool:
    fields = _in_place(old, new)
    return old.model_dump(exclude=fields) != new.model_dump(exclude=fields)


def replicas_changed(old: ModelConfig, new: ModelConfig) -> bool:
    """Whether a change the running backend takes in place touches its replicas."""
    if not isinstance(old, ReplicatedModel) or type(old) is not type(new):
        return False
    fields = set(REPLICA_FIELDS)
    return old.model_dump(include=fields) != new.model_dump(include=fields)


def diff_configs(old: AppConfig, new: AppConfig) -> ConfigDiff:
    before = {m.name: m for m in old.models}
    after = {m.name: m for m in new.models}
    reloaded: list[str] = []
    updated: list[str] = []
    unchanged: list[str] = []
    for name, model in after.items():
        previous = before.get(name)
        if previous is None:
            continue
        if needs_restart(previous, model):
            reloaded.append(name)
        elif previous != model:
            updated.append(name)
        else:
            unchanged.append(name)
    return ConfigDiff(
        added=tuple(name for name in after if name not in before),
        removed=tuple(name for name in before if name not in after),
        reloaded=tuple(reloaded),
        updated=tuple(updated),
        unchanged=tuple(unchanged),
        server_changed=old.server != new.server,
        routes_changed=old.routes != new.routes,
    )
