"""Triton's metrics page as the replica scraper reads it, and the triton replica config.

``tests/data/triton_metrics.txt`` is the page of a real tritonserver 2.51 (CPU, the
repository's ``llm`` model) captured from ``/metrics``; the tests rewrite sample values
in it and add lines a second model and TensorRT-LLM would produce, keeping the format.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.replicas.scrape import parse_load
from backends.triton.servers import endpoints, metrics_url
from config.schema import TritonModelConfig

PAGE = (Path(__file__).parents[1] / "data" / "triton_metrics.txt").read_text()
PENDING = 'nv_inference_pending_request_count{model="llm",version="1"} 0'


def test_real_page_reads_the_pending_gauge_of_the_served_model() -> None:
    assert PENDING in PAGE
    idle = parse_load(PAGE, "llm")
    assert idle.seen and (idle.waiting, idle.running, idle.kv_usage) == (0.0, 0.0, 0.0)
    busy = PAGE.replace(PENDING, PENDING[:-1] + "3")
    other = 'nv_inference_pending_request_count{model="echo",version="1"} 7'
    busy = busy.replace(PENDING[:-1] + "3", PENDING[:-1] + "3\n" + other)
    assert parse_load(busy, "llm").waiting == 3
    assert parse_load(busy, "echo").waiting == 7
    assert parse_load(busy).waiting == 10  # no model given: the whole server
    # Counters and other gauges on the page never count as load.
    assert not parse_load(PAGE.replace(PENDING, ""), "llm").seen


def test_tensorrt_llm_request_metrics_give_running_and_waiting() -> None:
    trt = "\n".join(
        f'nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="{kind}",version="1"}} {n}'
        for kind, n in (("active", 9), ("max", 64), ("scheduled", 6), ("context", 2))
    )
    load = parse_load(PAGE + trt + "\n", "ensemble")
    # active - scheduled wait; scheduled run; max and context are not load
    assert (load.waiting, load.running) == (3.0, 6.0)


def test_triton_replicas_config() -> None:
    base = {"name": "t", "backend": "triton", "triton_model": "llm"}
    one = TritonModelConfig(**base, url="10.0.0.1:8001")  # type: ignore[arg-type]
    assert endpoints(one) == [("10.0.0.1:8001", "http://10.0.0.1:8002/metrics")]
    two = TritonModelConfig(
        **base,  # type: ignore[arg-type]
        replicas=["triton-0:8001", {"url": "triton-1:8001", "metrics_url": "http://m:9/metrics"}],
        metrics_port=9102,
        balance="prefix",
    )
    assert endpoints(two) == [
        ("triton-0:8001", "http://triton-0:9102/metrics"),
        ("triton-1:8001", "http://m:9/metrics"),
    ]
    assert metrics_url("[::1]:8001", 8002) == "http://[::1]:8002/metrics"
    for bad in ({}, {"url": "a:1", "replicas": ["b:1"]}, {"replicas": ["a:1", "a:1"]}):
        with pytest.raises(ValueError, match=r"url and replicas|twice"):
            TritonModelConfig(**base, **bad)  # type: ignore[arg-type]


async def test_reconfigure_adds_and_drains_servers_without_a_start() -> None:
    from prometheus_client import CollectorRegistry

    from backends.hop_metrics import BackendMetrics
    from backends.triton.backend import TritonBackend

    base = {"name": "t", "backend": "triton", "triton_model": "llm"}
    backend = TritonBackend(
        TritonModelConfig(**base, replicas=["a:1", "b:1"]),  # type: ignore[arg-type]
        BackendMetrics(CollectorRegistry()),
    )
    backend.reconfigure(TritonModelConfig(**base, replicas=["b:1", "c:1"]))  # type: ignore[arg-type]
    assert list(backend._servers) == ["b:1", "c:1"]
    assert [r["url"] for r in backend.replica_status()] == ["b:1", "c:1"]
    await backend.stop()
