"""Pure parts of replica balancing: the policies, the affinity key, the metrics parser."""

from __future__ import annotations

import random

import pytest

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams
from backends.replicas.balance import (
    LeastLoaded,
    PrefixAffinity,
    RoundRobin,
    affinity_key,
    bounded_capacity,
)
from backends.replicas.scrape import parse_load
from config.schema import OpenAIModelConfig

URLS = [f"http://vllm-{i}:8000/v1" for i in range(4)]


def test_round_robin_skips_ineligible() -> None:
    policy = RoundRobin()
    picks = [policy.choose([0, 2], [0] * 4, [0.0] * 4, "").index for _ in range(4)]
    assert picks == [0, 2, 0, 2]


def test_power_of_two_prefers_lower_load_and_spreads_ties() -> None:
    policy = LeastLoaded(random.Random(1))
    load = [5.0, 0.0]
    assert {policy.choose([0, 1], [0, 0], load, "").index for _ in range(20)} == {1}
    picks = [policy.choose([0, 1, 2, 3], [0] * 4, [0.0] * 4, "").index for _ in range(200)]
    assert set(picks) == {0, 1, 2, 3}
    assert policy.choose([3], [9] * 4, [9.0] * 4, "").reason == "only"


def test_prefix_ring_is_stable_and_bounded() -> None:
    ring = PrefixAffinity(URLS, 1.5)
    same = PrefixAffinity(list(URLS), 1.5)  # another gateway with the same config
    keys = [f"key-{i}" for i in range(400)]
    assert [ring.primary(k) for k in keys] == [same.primary(k) for k in keys]
    shares = [sum(ring.primary(k) == r for k in keys) for r in range(4)]
    assert min(shares) > 60, shares  # virtual nodes keep the shares near 100 each
    home = ring.primary("hot")
    idle = ring.choose([0, 1, 2, 3], [0] * 4, [0.0] * 4, "hot")
    assert (idle.index, idle.reason) == (home, "affinity")
    inflight = [0, 0, 0, 0]
    inflight[home] = 4  # capacity max(ceil(1.5 * 5/4), ceil(5/4 + 2 sqrt(5/4))) = 4: full
    spilled = ring.choose([0, 1, 2, 3], inflight, [0.0] * 4, "hot")
    assert spilled.index != home and spilled.reason == "spill"
    others = [i for i in range(4) if i != home]
    assert ring.choose(others, [0] * 4, [0.0] * 4, "hot").index in others


def test_bounded_capacity_is_the_factor_at_scale_and_a_noise_floor_when_small() -> None:
    # 4 replicas, 15 others in flight: the mean with this request is 4; the plain bound
    # ceil(1.5 * 4) = 6 is one Poisson deviation (2) away, the floor is 4 + 2 * 2 = 8.
    assert bounded_capacity(15, 4, 1.5) == 8
    assert bounded_capacity(399, 4, 1.5) == 150  # mean 100: the factor decides
    assert bounded_capacity(399, 4, 2.0) == 200
    assert bounded_capacity(0, 4, 1.5) == 2  # idle: any replica takes the first request


def _chat(*messages: tuple[str, str], **fields: object) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=1),
        messages=tuple(ChatMessage(role, text) for role, text in messages),  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def test_affinity_key_order_of_preference() -> None:
    system = ("system", "You are a helpful assistant. " * 20)
    first = affinity_key(_chat(system, ("user", "one")), 256)
    second = affinity_key(_chat(system, ("user", "two")), 256)
    assert first == second and len(first) == 2 + 256  # a long shared prefix decides
    assert affinity_key(_chat(("user", "a")), 256) != affinity_key(_chat(("user", "b")), 256)
    assert affinity_key(_chat(system, user="alice"), 256) == "u:alice"
    assert affinity_key(_chat(system, user="alice", session_id="s1"), 256) == "s:s1"


def test_parse_load_reads_vllm_and_triton_gauges() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Number of requests waiting.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0',
            'vllm:num_requests_running{model_name="m x"} 7.0',
            'vllm:gpu_cache_usage_perc{model_name="m"} 0.25',
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5 1712345678',
            'vllm:num_requests_waiting_total{model_name="m"} 99',
            "nv_inference_pending_request_count 4",
            "vllm:num_requests_running NaN",
        ]
    )
    load = parse_load(text)
    assert (load.waiting, load.running, load.kv_usage, load.seen) == (9.0, 7.0, 0.5, True)
    assert not parse_load("fake_running 3\n").seen


def test_config_takes_base_url_or_replicas() -> None:
    base = {"name": "m", "backend": "openai"}
    assert OpenAIModelConfig(**base, base_url="http://a/v1").upstream_urls == ("http://a/v1",)
    two = OpenAIModelConfig(**base, replicas=["http://a/v1", "http://b/v1"], balance="prefix")
    assert two.upstream_urls == ("http://a/v1", "http://b/v1")
    for bad in ({}, {"base_url": "http://a", "replicas": ["http://b"]}, {"replicas": ["x", "x"]}):
        with pytest.raises(ValueError, match=r"base_url and replicas|twice"):
            OpenAIModelConfig(**base, **bad)  # type: ignore[arg-type]


def test_replicas_example_loads() -> None:
    from pathlib import Path

    from config.loader import load_config

    path = Path(__file__).resolve().parents[2] / "config" / "examples" / "replicas.yaml"
    (model,) = load_config(path).models
    assert isinstance(model, OpenAIModelConfig)
    assert len(model.upstream_urls) == 2 and model.balance == "prefix"
