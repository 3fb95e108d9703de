"""The load generator against the in-process fake upstream: counts and timings must add up."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bench.cli import main
from bench.client import RequestOptions
from bench.fake_upstream import FakeOptions, FakeUpstream
from bench.loadgen import LoadSpec, new_session, run_level
from bench.prompts import builtin_prompts
from bench.stats import Slo, summarize

DELAY = 0.003


def _fake_options(delay_s: float) -> FakeOptions:
    # A token every delay_s, the first one too; as many as the request asks for.
    ms = delay_s * 1000
    return FakeOptions(chunks=100_000, delay_ms=ms, ttft_ms=ms, model="fake")


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream(_fake_options(DELAY))
    await fake.start()
    yield fake
    await fake.stop()


def _reset(server: FakeUpstream) -> FakeUpstream:
    server.bodies.clear()
    server.faults.clear()
    server.peak = 0
    server.options.usage = True
    return server


def _options(server: FakeUpstream, **kw: object) -> RequestOptions:
    return RequestOptions(base_url=server.url + "/v1", model=str(kw.pop("model", "fake")), **kw)  # type: ignore[arg-type]


async def _run(server: FakeUpstream, load: LoadSpec, **kw: object):  # type: ignore[no-untyped-def]
    async with new_session(64) as session:
        return await run_level(session, _options(server, **kw), builtin_prompts(32), load)


async def test_closed_loop_streaming_counts_add_up(server: FakeUpstream) -> None:
    app = _reset(server)
    load = LoadSpec(concurrency=4, num_requests=10, warmup=2)
    run = await _run(server, load, max_tokens=6)
    assert len(run.results) == 12
    assert len(run.measured) == 10
    assert sum(r.warmup for r in run.results) == 2
    assert app.peak == 4  # closed loop keeps exactly c requests in flight
    for r in run.measured:
        assert r.ok, r.error
        assert r.output_tokens == 6 and r.tokens_from_usage
        # the fake counts one token per prompt word, plus one
        assert r.prompt_tokens == len(builtin_prompts(32)[r.prompt_index].text.split()) + 1
        assert len(r.chunk_times) == 6
        assert len(r.itls) == r.output_tokens - 1
        # The server sleeps before every chunk; gaps may bunch up client-side under load.
        assert r.e2e >= 6 * DELAY and sum(r.itls) <= r.e2e
        assert r.ttft is not None and 0 < r.ttft <= r.e2e
        assert r.chunk_times == tuple(sorted(r.chunk_times))
    s = summarize(run.results, wall_s=run.wall_s)
    assert (s.requests, s.ok, s.errors) == (10, 10, 0)
    assert s.output_tokens == 60
    assert s.itl_ms.count == 50
    assert s.itl_ms.p50 is not None and s.e2e_ms.p50 is not None
    assert s.itl_ms.p50 <= s.e2e_ms.p50
    assert s.output_tokens_per_s == pytest.approx(60 / run.wall_s)
    assert s.tokens_from_usage
    # What went over the wire: greedy, ignore_eos, usage requested, the built-in prompts.
    body = app.bodies[0]
    assert body["temperature"] == 0.0 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][0]["content"] == builtin_prompts(1)[0].text
    # The load generator itself stays cheap (generous bound: shared CI cores).
    assert run.client_cpu_s / 10 < 0.05


async def test_chunk_counting_without_usage(server: FakeUpstream) -> None:
    _reset(server).options.usage = False
    run = await _run(server, LoadSpec(concurrency=2, num_requests=4), max_tokens=5)
    for r in run.measured:
        assert r.ok and not r.tokens_from_usage
        assert r.output_tokens == 5 == len(r.itls) + 1


async def test_non_streaming_and_completions(server: FakeUpstream) -> None:
    app = _reset(server)
    run = await _run(
        server,
        LoadSpec(concurrency=2, num_requests=4),
        stream=False,
        api="completions",
        max_tokens=3,
    )
    for r in run.measured:
        assert r.ok, r.error
        assert r.output_tokens == 3 and r.chunk_times == () and r.itls == ()
        assert r.ttft == r.e2e  # the client sees the first token with the whole answer
    assert "prompt" in app.bodies[0] and "stream_options" not in app.bodies[0]


async def test_errors_and_timeouts_are_results(server: FakeUpstream) -> None:
    _reset(server).faults.extend([500] * 3)
    run = await _run(server, LoadSpec(concurrency=2, num_requests=3))
    assert all(not r.ok and r.status == 500 and "injected" in (r.error or "") for r in run.results)
    s = summarize(run.results, Slo(ttft_ms=1000), wall_s=run.wall_s)
    assert s.errors == 3 and s.goodput_fraction == 0.0
    server.faults.append("stall")
    run = await _run(server, LoadSpec(concurrency=1, num_requests=1), timeout_s=0.3)
    assert run.results[0].error == "timeout after 0.3s"
    assert 0.3 <= run.results[0].e2e < 2.0


async def test_open_loop_poisson(server: FakeUpstream) -> None:
    app = _reset(server)
    run = await _run(server, LoadSpec(rate=200.0, num_requests=12, seed=1), max_tokens=2)
    assert len(run.measured) == 12 and all(r.ok for r in run.measured)
    starts = sorted(r.start for r in run.measured)
    assert starts[-1] - starts[0] < 2.0  # ~12/200 s of arrivals plus scheduling slack
    assert len(app.bodies) == 12


async def test_duration_bounds_a_level(server: FakeUpstream) -> None:
    _reset(server)
    run = await _run(server, LoadSpec(concurrency=2, duration_s=0.2), max_tokens=4)
    assert 0.2 <= run.wall_s < 2.0
    assert len(run.measured) >= 2


def test_cli_run_writes_outputs(tmp_path: Path) -> None:
    # main() runs its own event loop (asyncio.run), so the fake serves from a thread here.
    ready = threading.Event()
    port_box: list[int] = []
    stop: list[object] = []

    def serve() -> None:
        loop = asyncio.new_event_loop()
        fake = FakeUpstream(_fake_options(0.001))
        loop.run_until_complete(fake.start())
        port_box.append(int(fake.url.rsplit(":", 1)[1]))
        stop.append(loop)
        ready.set()
        loop.run_forever()
        loop.run_until_complete(fake.stop())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        code = main(
            [
                "run",
                "--base-url",
                f"http://127.0.0.1:{port_box[0]}/v1",
                "--model",
                "fake",
                "--concurrency",
                "1,3",
                "--num-requests",
                "6",
                "--warmup",
                "1",
                "--max-tokens",
                "4",
                "--slo-ttft-ms",
                "5000",
                "--slo-itl-ms",
                "5000",
                "--out",
                str(tmp_path),
            ]
        )
    finally:
        loop = stop[0]
        loop.call_soon_threadsafe(loop.stop)  # type: ignore[attr-defined]
        thread.join(10)
    assert code == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [r["load"] for r in doc["runs"]] == ["c=1", "c=3"]
    for run in doc["runs"]:
        assert run["summary"]["ok"] == 6 and run["summary"]["output_tokens"] == 24
        assert run["summary"]["goodput_fraction"] == 1.0
        assert len(run["samples"]) == 7 and sum(s["warmup"] for s in run["samples"]) == 1
    assert "| fake | c=3 |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.png").stat().st_size > 10_000
    assert doc["meta"]["cpu_count"] >= 1


async def test_on_measured_runs_after_the_warm_up_and_before_the_measured_phase(
    server: FakeUpstream,
) -> None:
    app = _reset(server)
    seen: list[int] = []
    load = LoadSpec(concurrency=2, num_requests=4, warmup=3)
    async with new_session(8) as session:
        run = await run_level(
            session,
            _options(server, max_tokens=2),
            builtin_prompts(32),
            load,
            lambda: seen.append(len(app.bodies)),
        )
    assert seen == [3]  # every warm-up request answered, no measured one sent yet
    assert len(app.bodies) == 7 and len(run.measured) == 4
