"""Which config changes a running replicated backend takes in place on hot reload."""

from __future__ import annotations

from typing import Any

from config.schema import AppConfig
from gateway.registry.diff import diff_configs, needs_restart, replicas_changed


def _app(**fields: Any) -> AppConfig:
    model = {"name": "m", "backend": "openai", "replicas": ["http://a/v1"], **fields}
    return AppConfig.model_validate({"models": [model]})


def test_replica_and_balance_fields_update_in_place_others_restart() -> None:
    old = _app()
    for change in (
        {"replicas": ["http://a/v1", "http://b/v1"]},
        {"replicas": [], "base_url": "http://a/v1"},
        {"balance": "prefix", "prefix_load_factor": 2.0, "prefix_chars": 64},
        {"metrics_scrape_interval": 0.0},
    ):
        new = _app(**change)
        diff = diff_configs(old, new)
        assert diff.updated == ("m",) and diff.reloaded == (), change
        assert replicas_changed(old.models[0], new.models[0])
    for change in ({"retries": 0}, {"upstream_model": "x"}, {"breaker_failures": 1}):
        assert diff_configs(old, _app(**change)).reloaded == ("m",), change
    assert not replicas_changed(old.models[0], _app(priority=3).models[0])


def test_triton_replicas_and_metrics_port_update_in_place() -> None:
    base = {"name": "t", "backend": "triton", "triton_model": "llm"}
    old = AppConfig.model_validate({"models": [{**base, "url": "a:1"}]}).models[0]
    new = AppConfig.model_validate(
        {"models": [{**base, "replicas": ["a:1", "b:1"], "metrics_port": 9}]}
    ).models[0]
    assert not needs_restart(old, new) and replicas_changed(old, new)
    other = AppConfig.model_validate({"models": [{**base, "url": "a:1", "tokenizer": "x"}]})
    assert needs_restart(old, other.models[0])
