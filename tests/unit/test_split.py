"""Traffic splits and mirrors, the pure parts and the registry: weighted picks, sticky
sessions, deterministic mirror choice, config validation, routing and reload diffs."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from config.loader import ConfigError, load_config
from config.schema import AppConfig
from gateway.registry import ModelNotFound, ModelRegistry, RegistryMetrics
from gateway.registry.diff import diff_configs
from gateway.registry.split import SplitKey, mirrored, pick, unit
from tests.tools.registry_fakes import FakeFactory, fake_model

NINETY_TEN = (("a", 90.0), ("b", 10.0))


def config(*models: dict[str, Any], routes: list[dict[str, Any]] | None = None) -> AppConfig:
    return AppConfig.model_validate({"models": list(models), "routes": routes or []})


def two_models(**extra: Any) -> list[dict[str, Any]]:
    return [fake_model("a", aliases=["alpha"], **extra), fake_model("b")]


# --------------------------------------------------------------------------- pure choices


def test_unit_stays_strictly_inside_zero_and_one() -> None:
    values = [unit("t", str(i)) for i in range(20_000)]
    assert min(values) > 0.0 and max(values) < 1.0
    assert 0.45 < sum(values) / len(values) < 0.55


def test_pick_follows_the_weights() -> None:
    counts = Counter(pick(NINETY_TEN, f"request:{i}") for i in range(20_000))
    assert 0.88 < counts["a"] / 20_000 < 0.92
    thirds = Counter(pick((("x", 1), ("y", 1), ("z", 1)), f"k{i}") for i in range(9_000))
    assert all(2_700 < n < 3_300 for n in thirds.values())


def test_pick_is_stable_and_moves_few_keys_when_a_weight_changes() -> None:
    keys = [f"session:{i}" for i in range(5_000)]
    before = {k: pick(NINETY_TEN, k) for k in keys}
    assert before == {k: pick(NINETY_TEN, k) for k in keys}  # same weights, same target
    after = {k: pick((("a", 80.0), ("b", 20.0)), k) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    # Only a->b moves are needed (about 10 % of the keys), never b->a.
    assert all(before[k] == "a" and after[k] == "b" for k in moved)
    assert 0.07 < len(moved) / len(keys) < 0.13


def test_split_key_uses_the_session_only_when_sticky() -> None:
    key = SplitKey("req-1", "user-7")
    assert key.for_route(sticky=True) == "session:user-7"
    assert key.for_route(sticky=False) == "request:req-1"
    assert SplitKey("req-1").for_route(sticky=True) == "request:req-1"


def test_mirror_choice_is_deterministic_per_request_id() -> None:
    ids = [f"req-{i}" for i in range(10_000)]
    chosen = [i for i in ids if mirrored(i, 0.1)]
    assert chosen == [i for i in ids if mirrored(i, 0.1)]
    assert 900 < len(chosen) < 1_100
    assert all(mirrored(i, 1.0) for i in ids)
    assert set(chosen) <= {i for i in ids if mirrored(i, 0.5)}  # a larger share keeps these


# --------------------------------------------------------------------------- validation


def test_routes_and_mirror_parse() -> None:
    parsed = config(
        *two_models(mirror={"model": "b", "share": 0.25}),
        routes=[{"name": "chat", "split": {"alpha": 90, "b": 10}, "sticky": False}],
    )
    route = parsed.routes[0]
    assert route.targets == (("alpha", 90.0), ("b", 10.0)) and route.sticky is False
    mirror = parsed.models[0].mirror
    assert mirror is not None
    assert (mirror.model, mirror.share, mirror.max_inflight) == ("b", 0.25, 4)


@pytest.mark.parametrize(
    ("routes", "message"),
    [
        ([{"name": "chat", "split": {"a": 90, "nope": 10}}], "split target 'nope' is not a"),
        ([{"name": "a", "split": {"b": 1}}], "route 'a': name is already a model"),
        ([{"name": "alpha", "split": {"b": 1}}], "route 'alpha': name is already a model"),
        (
            [{"name": "r", "split": {"b": 1}}, {"name": "r", "split": {"a": 1}}],
            "route 'r': name is used by two routes",
        ),
        (
            [{"name": "r", "split": {"b": 1}}, {"name": "s", "split": {"r": 1}}],
            "split target 'r' is a route",
        ),
        ([{"name": "r", "split": {"a": 1, "alpha": 1}}], "names the same model as 'a'"),
    ],
)
def test_bad_routes_are_refused_naming_the_route(
    routes: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        config(*two_models(), routes=routes)


@pytest.mark.parametrize(
    ("split", "where"),
    [({"a": 0}, ("routes", 0, "split", "a")), ({"a": -5}, ("routes", 0, "split", "a"))],
)
def test_weights_must_be_positive(split: dict[str, float], where: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as caught:
        config(*two_models(), routes=[{"name": "r", "split": split}])
    assert caught.value.errors()[0]["loc"] == where


def test_an_empty_split_is_refused() -> None:
    with pytest.raises(ValidationError, match="split"):
        config(*two_models(), routes=[{"name": "r", "split": {}}])


@pytest.mark.parametrize(
    ("mirror", "message"),
    [
        ({"model": "nope", "share": 0.1}, "model 'a': mirror.model 'nope' is not a"),
        ({"model": "alpha", "share": 0.1}, "mirror.model 'alpha' is the model itself"),
        ({"model": "b", "share": 0}, "greater than 0"),
        ({"model": "b", "share": 1.5}, "less than or equal to 1"),
        ({"model": "b", "share": 0.5, "max_inflight": 0}, "greater than 0"),
    ],
)
def test_bad_mirrors_are_refused(mirror: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        config(fake_model("a", aliases=["alpha"], mirror=mirror), fake_model("b"))


def test_a_split_or_mirror_between_tasks_is_refused() -> None:
    embed = {"name": "e", "backend": "hf", "source": "x", "task": "embed", "preload": False}
    with pytest.raises(ValidationError, match="split mixes embed and generate"):
        config(fake_model("a"), embed, routes=[{"name": "r", "split": {"a": 1, "e": 1}}])
    with pytest.raises(ValidationError, match="serves embed, not generate"):
        config(fake_model("a", mirror={"model": "e", "share": 1}), embed)


def test_the_loader_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    raw = {"models": two_models(), "routes": [{"name": "r", "split": {"a": -1}}]}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"routes\.0\.split\.a: Input should be greater than 0"):
        load_config(path)


# --------------------------------------------------------------------------- registry


def registry_for(parsed: AppConfig) -> tuple[ModelRegistry, CollectorRegistry]:
    prometheus = CollectorRegistry()
    return ModelRegistry(parsed, RegistryMetrics(prometheus), FakeFactory()), prometheus


def test_registry_routes_a_split_to_a_target_and_its_fallbacks() -> None:
    parsed = config(
        fake_model("a"),
        fake_model("b", fallback=["a"]),
        routes=[{"name": "chat", "split": {"a": 90, "b": 10}}],
    )
    registry, prometheus = registry_for(parsed)
    decisions = [registry.route("chat", SplitKey(f"req-{i}")) for i in range(400)]
    firsts = Counter(d.candidates[0] for d in decisions)
    assert 340 <= firsts["a"] <= 380  # 90 % +- 5 % of 400
    for decision in decisions:
        assert decision.reason == "split" and decision.route == "chat"
        assert decision.candidates == (("a",) if decision.target == "a" else ("b", "a"))
    assert prometheus.get_sample_value("llmso_route_decisions_total", {"reason": "split"}) == 400
    # Counted per target only when the service says the request went there.
    registry.record_split(decisions[0])
    sample = prometheus.get_sample_value(
        "llmso_route_requests_total", {"route": "chat", "target": decisions[0].target or ""}
    )
    assert sample == 1


def test_a_sticky_session_stays_on_one_target() -> None:
    parsed = config(*two_models(), routes=[{"name": "chat", "split": {"a": 50, "b": 50}}])
    registry, _ = registry_for(parsed)
    for session in ("s1", "s2", "s3", "s4"):
        targets = {registry.route("chat", SplitKey(f"r{i}", session)).target for i in range(50)}
        assert len(targets) == 1
    loose = config(
        *two_models(), routes=[{"name": "chat", "split": {"a": 50, "b": 50}, "sticky": False}]
    )
    registry, _ = registry_for(loose)
    targets = {registry.route("chat", SplitKey(f"r{i}", "s1")).target for i in range(50)}
    assert targets == {"a", "b"}


def test_a_split_picks_among_the_targets_a_key_may_use() -> None:
    parsed = config(*two_models(), routes=[{"name": "chat", "split": {"alpha": 99, "b": 1}}])
    registry, _ = registry_for(parsed)
    may_use = {"b"}.__contains__
    only_b = {registry.route("chat", SplitKey(f"r{i}"), may_use).target for i in range(50)}
    assert only_b == {"b"}
    with pytest.raises(ModelNotFound, match="'chat' does not exist"):
        registry.route("chat", SplitKey("r"), lambda name: False)
    assert registry.splits.targets("chat") == ("a", "b")  # alias resolved
    assert registry.splits.targets("a") == ()


async def test_reload_swaps_weights_and_mirrors_in_place() -> None:
    old = config(*two_models(), routes=[{"name": "chat", "split": {"a": 100, "b": 1}}])
    new = config(
        *two_models(mirror={"model": "b", "share": 0.5}),
        routes=[{"name": "chat", "split": {"a": 1, "b": 100}}],
    )
    diff = diff_configs(old, new)
    assert diff.routes_changed and diff.changed
    assert diff.updated == ("a",) and diff.reloaded == ()  # the mirror needs no restart
    registry, _ = registry_for(old)
    keys = [SplitKey(f"r{i}") for i in range(100)]
    assert Counter(registry.route("chat", k).target for k in keys)["a"] > 90
    assert registry.mirror_of("a") is None
    await registry.apply_config(new)
    assert Counter(registry.route("chat", k).target for k in keys)["b"] > 90
    found = registry.mirror_of("a")
    assert found is not None and found[0] == "b" and found[1].share == 0.5
    await registry.stop()
