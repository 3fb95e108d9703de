"""Pure routing: which configured models may answer a requested ``model`` string.

A request names a model exactly, by alias, by a LoRA adapter's name, or by capability with the
``capability:<name>`` syntax (``capability:small``). For a capability, models that are
already serving come first, then the ones that are loading, then the ones that would
have to load, then the ones that cannot serve now (draining, failed); within a tier a
higher ``priority`` wins, then the name. Every match is followed by its fallback chain
(transitively, each model once). Unknown names never load anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from config.schema import ModelConfig
from gateway.registry.errors import ModelNotFound
from gateway.registry.values import ModelState, RouteDecision

CAPABILITY_PREFIX = "capability:"

_TIER = {
    ModelState.READY: 0,
    ModelState.ACTIVE: 0,
    ModelState.LOADING: 1,
    ModelState.UNLOADED: 2,
    ModelState.DRAINING: 3,
    ModelState.FAILED: 3,
}


def build_index(models: Iterable[ModelConfig]) -> dict[str, str]:
    """Map every name and alias to the model's canonical name (the schema keeps them unique)."""
    index: dict[str, str] = {}
    for model in models:
        index[model.name] = model.name
        for alias in model.aliases:
            index[alias] = model.name
    return index


def build_adapter_index(models: Iterable[ModelConfig]) -> dict[str, tuple[str, str]]:
    """Map every adapter name and alias to ``(base model, adapter name)``."""
    index: dict[str, tuple[str, str]] = {}
    for model in models:
        for adapter in getattr(model, "adapters", ()):
            for key in (adapter.name, *adapter.aliases):
                index[key] = (model.name, adapter.name)
    return index


def route(
    requested: str,
    models: Mapping[str, ModelConfig],
    index: Mapping[str, str],
    state_of: Callable[[str], ModelState],
    adapters: Mapping[str, tuple[str, str]] | None = None,
) -> RouteDecision:
    """Candidates for ``requested``; raises ``ModelNotFound`` when nothing matches. An
    adapter is served by its base model only: another model of a fallback chain would
    answer without it."""
    if adapters and requested in adapters:
        base, adapter = adapters[requested]
        return RouteDecision((base,), "adapter", adapter)
    if requested.startswith(CAPABILITY_PREFIX):
        capability = requested[len(CAPABILITY_PREFIX) :]
        matches = [m for m in models.values() if capability in m.capabilities]
        if not matches:
            raise ModelNotFound(f"No model has the capability '{capability}'", param="model")
        matches.sort(key=lambda m: (_TIER[state_of(m.name)], -m.priority, m.name))
        return RouteDecision(
            _with_fallbacks([m.name for m in matches], models, index), "capability"
        )
    name = index.get(requested)
    if name is None:
        raise ModelNotFound(f"The model '{requested}' does not exist", param="model")
    reason = "exact" if name == requested else "alias"
    return RouteDecision(_with_fallbacks([name], models, index), reason)


def _with_fallbacks(
    first: list[str], models: Mapping[str, ModelConfig], index: Mapping[str, str]
) -> tuple[str, ...]:
    """``first`` followed by each one's fallback chain, breadth first, without repeats."""
    ordered: list[str] = []
    seen: set[str] = set()
    queue = list(first)
    while queue:
        name = queue.pop(0)
        if name in seen or name not in models:
            continue
        seen.add(name)
        ordered.append(name)
        queue.extend(index.get(target, target) for target in models[name].fallback)
    return tuple(ordered)
