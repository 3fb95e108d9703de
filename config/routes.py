"""Config of traffic splits and mirrors.

A route (``routes:``) is a name of its own whose requests go to one of several weighted
targets; a model's ``mirror`` copies a share of its requests to a shadow model. Both are
checked against the model list by ``check_routes``, which ``AppConfig`` calls once the
models are known; every error names the route or model and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Protocol

from pydantic import BaseModel, ConfigDict, Field

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"

Weight = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RouteConfig(_Frozen):
    """A name whose requests each go to one target, picked by weight."""

    name: str = Field(
        pattern=NAME_PATTERN,
        description="The model id clients ask for; unique among models, aliases, adapters "
        "and routes.",
    )
    split: dict[str, Weight] = Field(
        min_length=1,
        description="Targets (model names, aliases or LoRA adapter names) and their positive "
        "weights; a target takes weight / sum of weights of the requests.",
    )
    sticky: bool = Field(
        True,
        description="A request with an x-session-id header (else a `user` field) goes to the "
        "same target as every other request of that session while the weights stay the same; "
        "false: every request is drawn on its own.",
    )

    @property
    def targets(self) -> tuple[tuple[str, float], ...]:
        """``(target, weight)`` pairs in config order."""
        return tuple(self.split.items())


class MirrorConfig(_Frozen):
    """A model's shadow: a share of its requests is also sent to ``model``, whose answers
    are logged and measured but never returned to the client nor charged to its key."""

    model: str = Field(min_length=1, description="The shadow model (a model name or alias).")
    share: float = Field(
        gt=0,
        le=1,
        description="Share of this model's requests copied to the shadow (0 < share <= 1), "
        "chosen by request id.",
    )
    max_inflight: int = Field(
        4,
        gt=0,
        description="Copies of this model's requests in flight at once; one more is dropped "
        "(and counted).",
    )


class _Model(Protocol):
    """What ``check_routes`` reads of a model config."""

    @property
    def name(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def mirror(self) -> MirrorConfig | None: ...


def check_routes(models: Sequence[_Model], routes: Sequence[RouteConfig]) -> None:
    """Raise ``ValueError`` naming the route or model and field when a route or mirror does
    not fit the models: unknown targets, clashing names, mixed tasks, a self mirror."""
    index = _model_index(models)  # name or alias -> canonical model name
    adapters = _adapter_index(models)  # adapter name or alias -> base model
    tasks = {model.name: getattr(model, "task", "generate") for model in models}
    seen: set[str] = set()
    for route in routes:
        if route.name in index or route.name in adapters:
            raise ValueError(f"route {route.name!r}: name is already a model, alias or adapter")
        if route.name in seen:
            raise ValueError(f"route {route.name!r}: name is used by two routes")
        seen.add(route.name)
    for route in routes:
        _check_split(route, index, adapters, tasks, seen)
    for model in models:
        if model.mirror is not None:
            _check_mirror(model.name, model.mirror, index, tasks)


def _check_split(
    route: RouteConfig,
    index: Mapping[str, str],
    adapters: Mapping[str, str],
    tasks: Mapping[str, str],
    routes: Iterable[str],
) -> None:
    served: dict[str, str] = {}  # what each target resolves to, to catch doubles
    for target in route.split:
        where = f"route {route.name!r}: split target {target!r}"
        if target in routes:
            raise ValueError(f"{where} is a route; routes do not nest")
        base = index.get(target) or adapters.get(target)
        if base is None:
            raise ValueError(f"{where} is not a configured model, alias or adapter")
        resolved = index.get(target, target)
        if resolved in served:
            raise ValueError(f"{where} names the same model as {served[resolved]!r}")
        served[resolved] = target
    kinds = {tasks[index.get(t) or adapters[t]] for t in route.split}
    if len(kinds) > 1:
        raise ValueError(f"route {route.name!r}: split mixes {' and '.join(sorted(kinds))} models")


def _check_mirror(
    name: str, mirror: MirrorConfig, index: Mapping[str, str], tasks: Mapping[str, str]
) -> None:
    shadow = index.get(mirror.model)
    where = f"model {name!r}: mirror.model {mirror.model!r}"
    if shadow is None:
        raise ValueError(f"{where} is not a configured model or alias")
    if shadow == name:
        raise ValueError(f"{where} is the model itself")
    if tasks[shadow] != tasks[name]:
        raise ValueError(f"{where} serves {tasks[shadow]}, not {tasks[name]}")


def _model_index(models: Iterable[_Model]) -> dict[str, str]:
    return {key: model.name for model in models for key in (model.name, *model.aliases)}


def _adapter_index(models: Iterable[_Model]) -> dict[str, str]:
    return {
        key: model.name
        for model in models
        for adapter in getattr(model, "adapters", ())
        for key in (adapter.name, *adapter.aliases)
    }
