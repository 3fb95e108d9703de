"""Pure comparison of two configs for hot reload."""

from __future__ import annotations

from config.schema import AppConfig, ModelConfig
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
    }
)


def needs_restart(old: ModelConfig, new: ModelConfig) -> bool:
    return old.model_dump(exclude=set(IN_PLACE_FIELDS)) != new.model_dump(
        exclude=set(IN_PLACE_FIELDS)
    )


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
    )
