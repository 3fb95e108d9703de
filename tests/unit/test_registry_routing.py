"""Pure parts of the registry: routing, victim choice, config diffs, memory estimates."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from backends.factory import memory_estimate
from backends.hf.loading.memory_estimate import weights_bytes
from config.schema import HFModelConfig
from gateway.registry import ModelNotFound, ModelState
from gateway.registry.diff import diff_configs
from gateway.registry.eviction import Resident, busy_victim, idle_victim
from gateway.registry.routing import build_index, route
from tests.tools.registry_fakes import app_config, fake_model

CONFIG = app_config(
    fake_model("tiny", capabilities=["chat", "small"], priority=1, fallback=["mid"]),
    fake_model(
        "mid", aliases=["medium"], capabilities=["chat", "small"], priority=5, fallback=["large"]
    ),
    fake_model("large", aliases=["big"], capabilities=["chat"], priority=9, fallback=["tiny"]),
    fake_model("coder", capabilities=["code"]),
)
MODELS = {m.name: m for m in CONFIG.models}
INDEX = build_index(CONFIG.models)


def states(**given: ModelState) -> dict[str, ModelState]:
    return {name: given.get(name, ModelState.UNLOADED) for name in MODELS}


def decide(requested: str, **given: ModelState) -> tuple[tuple[str, ...], str]:
    current = states(**given)
    decision = route(requested, MODELS, INDEX, current.__getitem__)
    return decision.candidates, decision.reason


def test_exact_name_then_transitive_fallbacks_without_repeats() -> None:
    assert decide("tiny") == (("tiny", "mid", "large"), "exact")


def test_alias_resolves_to_canonical_name() -> None:
    assert decide("medium") == (("mid", "large", "tiny"), "alias")


def test_capability_orders_by_priority_among_equals() -> None:
    candidates, reason = decide("capability:small")
    assert reason == "capability"
    assert candidates == ("mid", "tiny", "large")  # large only as a fallback


def test_capability_prefers_ready_over_loadable() -> None:
    candidates, _ = decide("capability:chat", tiny=ModelState.ACTIVE)
    assert candidates == ("tiny", "large", "mid")


def test_capability_puts_failed_and_draining_last() -> None:
    candidates, _ = decide(
        "capability:chat",
        large=ModelState.FAILED,
        mid=ModelState.LOADING,
        tiny=ModelState.DRAINING,
    )
    assert candidates == ("mid", "large", "tiny")


@pytest.mark.parametrize("requested", ["nope", "capability:vision", "Tiny", "capability:"])
def test_unknown_names_and_capabilities_are_not_found(requested: str) -> None:
    with pytest.raises(ModelNotFound) as caught:
        decide(requested)
    assert caught.value.status == 404 and caught.value.param == "model"


def test_idle_victim_is_least_recently_used_idle() -> None:
    residents = [
        Resident("a", ModelState.READY, 10, 0, last_used=5.0),
        Resident("b", ModelState.READY, 10, 0, last_used=2.0),
        Resident("c", ModelState.ACTIVE, 10, 1, last_used=1.0),
        Resident("d", ModelState.LOADING, 10, 0, last_used=0.0),
        Resident("e", ModelState.READY, 0, 0, last_used=0.0),  # frees nothing
    ]
    assert idle_victim(residents, exclude="x") == "b"
    assert idle_victim(residents, exclude="b") == "a"
    assert busy_victim(residents, exclude="x") == "c"
    assert idle_victim(residents[2:4], exclude="x") is None


def test_diff_classifies_models() -> None:
    old = app_config(
        fake_model("keep"), fake_model("tweak"), fake_model("swap"), fake_model("drop")
    )
    new = app_config(
        fake_model("keep"),
        fake_model("tweak", priority=3, aliases=["t"]),
        fake_model("swap", upstream_model="other"),
        fake_model("fresh"),
    )
    diff = diff_configs(old, new)
    assert diff.added == ("fresh",)
    assert diff.removed == ("drop",)
    assert diff.reloaded == ("swap",)
    assert diff.updated == ("tweak",)
    assert diff.unchanged == ("keep",)
    assert diff.changed and not diff.server_changed


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header = {
        name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
        for name, (dtype, shape) in tensors.items()
    }
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


async def test_weights_bytes_from_safetensors_headers(tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "model-1.safetensors", {"w": ("BF16", [10, 20])})
    _write_safetensors(tmp_path / "model-2.safetensors", {"b": ("F32", [5])})
    assert weights_bytes(tmp_path) == 10 * 20 * 2 + 5 * 4
    assert weights_bytes(tmp_path, "float32") == (200 + 5) * 4
    (tmp_path / "config.json").write_text("{}")
    hf = HFModelConfig(name="local", backend="hf", source=str(tmp_path), dtype="bfloat16")
    assert await memory_estimate(hf) == 205 * 2
    assert await memory_estimate(hf.model_copy(update={"memory_bytes": 7})) == 7


async def test_unknown_sources_estimate_nothing(tmp_path: Path) -> None:
    missing = HFModelConfig(name="gone", backend="hf", source=str(tmp_path / "nothing"))
    assert await memory_estimate(missing) == 0
    assert await memory_estimate(CONFIG.models[0]) is None  # a proxy holds no local weights
