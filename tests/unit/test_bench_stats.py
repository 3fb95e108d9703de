"""Pure parts of llmso bench: statistics, ITL extraction, goodput, prompts, specs, /proc parsing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.client import RequestOptions, RequestResult, build_body, inter_token_gaps
from bench.loadgen import LoadSpec
from bench.procstat import (
    _parse_stat,
    group_cpu_seconds,
    group_cpu_split,
    process_cpu_seconds,
)
from bench.prompts import builtin_prompts, load_prompts
from bench.report import RunRecord, markdown_table, overhead_table
from bench.spec import CompareSpec, fill
from bench.stats import Distribution, Slo, meets_slo, percentile, summarize, tpot


def _result(
    *,
    index: int = 0,
    start: float = 0.0,
    chunks: tuple[float, ...] = (0.1, 0.15, 0.2),
    e2e: float = 0.25,
    ok: bool = True,
    warmup: bool = False,
    tokens: int | None = None,
) -> RequestResult:
    return RequestResult(
        index=index,
        prompt_index=index,
        ok=ok,
        status=200 if ok else 500,
        start=start,
        e2e=e2e,
        ttft=chunks[0] if chunks else None,
        chunk_times=chunks,
        output_tokens=len(chunks) if tokens is None else tokens,
        prompt_tokens=10,
        tokens_from_usage=tokens is not None,
        error=None if ok else "HTTP 500",
        warmup=warmup,
    )


def test_percentile_interpolates_like_numpy_linear() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_distribution_is_in_milliseconds() -> None:
    d = Distribution.of_seconds([0.010, 0.020, 0.030])
    assert d.count == 3 and d.p50 == pytest.approx(20.0) and d.max == pytest.approx(30.0)
    assert d.mean == pytest.approx(20.0)
    empty = Distribution.of_seconds([])
    assert empty.count == 0 and empty.p50 is None and empty.mean is None


def test_itl_extraction_from_timestamps() -> None:
    assert inter_token_gaps((1.0, 1.5, 1.75, 3.0)) == (0.5, 0.25, 1.25)
    assert inter_token_gaps((1.0,)) == ()
    assert inter_token_gaps(()) == ()
    r = _result(chunks=(0.1, 0.2, 0.4, 0.7))
    assert r.itls == pytest.approx((0.1, 0.2, 0.3))
    assert tpot(r) == pytest.approx(0.2)
    assert tpot(_result(chunks=(0.1,))) is None


def test_slo_needs_both_ttft_and_mean_itl() -> None:
    fast = _result(chunks=(0.05, 0.06, 0.07))  # TTFT 50 ms, TPOT 10 ms
    slow_start = _result(chunks=(0.5, 0.51, 0.52))  # TTFT 500 ms
    slow_tokens = _result(chunks=(0.05, 0.15, 0.25))  # TPOT 100 ms
    slo = Slo(ttft_ms=100, itl_ms=50)
    assert meets_slo(fast, slo)
    assert not meets_slo(slow_start, slo)
    assert not meets_slo(slow_tokens, slo)
    assert not meets_slo(_result(ok=False), slo)
    assert meets_slo(slow_start, Slo(itl_ms=50))  # only the ITL bound set


def test_summarize_excludes_warmup_counts_errors_and_goodput() -> None:
    results = [
        _result(index=0, start=0.0, warmup=True, chunks=(5.0, 5.1), e2e=9.0),
        _result(index=1, start=1.0, chunks=(0.05, 0.06, 0.07), e2e=0.1, tokens=3),
        _result(index=2, start=1.5, chunks=(0.5, 0.51, 0.52), e2e=0.6, tokens=3),
        _result(index=3, start=2.0, chunks=(), e2e=1.0, ok=False, tokens=0),
    ]
    s = summarize(results, Slo(ttft_ms=100))
    assert (s.requests, s.ok, s.errors) == (3, 2, 1)
    assert s.wall_s == pytest.approx(2.0)  # first measured start 1.0 to last end 3.0
    assert s.output_tokens == 6
    assert s.output_tokens_per_s == pytest.approx(6 / 2.0)
    assert s.requests_per_s == pytest.approx(2 / 2.0)
    assert s.itl_ms.count == 4  # (3 - 1) gaps for each successful request
    assert s.ttft_ms.p50 == pytest.approx(275.0)
    assert s.goodput_fraction == pytest.approx(1 / 3)
    assert s.goodput_per_s == pytest.approx(1 / 2.0)
    assert s.tokens_from_usage
    assert s.prompt_tokens == 20
    assert summarize(results).goodput_fraction is None  # no SLO given
    explicit = summarize(results, wall_s=4.0)
    assert explicit.output_tokens_per_s == pytest.approx(1.5)


def test_result_json_round_trip() -> None:
    r = _result(index=4, chunks=(0.1, 0.2), tokens=2)
    assert RequestResult.from_json(r.to_json()) == r


def test_request_body_fields() -> None:
    prompt = builtin_prompts(1)[0]
    opts = RequestOptions(base_url="http://h/v1/", model="m", max_tokens=9, ignore_eos=False)
    body = build_body(opts, prompt)
    assert opts.url == "http://h/v1/chat/completions"
    assert body["max_tokens"] == 9 and "ignore_eos" not in body
    assert body["messages"] == [{"role": "user", "content": prompt.text}]
    raw = RequestOptions(base_url="http://h/v1", model="m", api="completions", stream=False)
    body = build_body(raw, prompt)
    assert body["prompt"] == prompt.text and body["ignore_eos"] is True
    assert "stream_options" not in body


def test_builtin_prompts_are_deterministic_and_varied(tmp_path: Path) -> None:
    a, b = builtin_prompts(24), builtin_prompts(24)
    assert a == b
    lengths = {len(p.text) for p in a}
    assert max(lengths) > 5 * min(lengths)
    assert len({p.text for p in a}) >= 12
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello"}\n\n"bare"\n')
    assert [p.text for p in load_prompts(path)] == ["hello", "bare"]
    path.write_text('{"nope": 1}\n')
    with pytest.raises(ValueError):
        load_prompts(path)


def test_load_spec_validation() -> None:
    with pytest.raises(ValueError):
        LoadSpec(concurrency=2, rate=1.0, num_requests=1)
    with pytest.raises(ValueError):
        LoadSpec(concurrency=2)  # would never end
    assert LoadSpec(rate=2.5, duration_s=3).label == "rate=2.5"


def test_spec_placeholders_and_validation() -> None:
    values = {"port": "123", "port_fake": "9", "workdir": "/w"}
    assert fill("http://h:{port}/{port_fake} {workdir}/x {other}", values) == (
        "http://h:123/9 /w/x {other}"
    )
    assert fill("server: {host: a}", values) == "server: {host: a}"
    ok = {"systems": [{"label": "a", "base_url": "http://x"}], "concurrency": [1, 4]}
    spec = CompareSpec.model_validate(ok)
    assert spec.requests_for(1) == 8 and spec.requests_for(16) == 32
    with pytest.raises(ValueError):
        CompareSpec.model_validate({**ok, "baseline": "b"})
    with pytest.raises(ValueError):
        CompareSpec.model_validate({"systems": [{"label": "r", "kind": "reference"}]})
    with pytest.raises(ValueError):  # cpu_of must name a service
        CompareSpec.model_validate({"systems": [{"label": "a", "base_url": "x", "cpu_of": "up"}]})


def test_proc_stat_parsing_handles_odd_names() -> None:
    fields = ["S", "1", "4242", "4242"] + ["0"] * 7 + ["100", "50", "7", "3"] + ["0"] * 30
    line = "4243 (we ird) (name)) " + " ".join(fields)
    assert _parse_stat(line) == (4242, 150, 10)
    own = process_cpu_seconds(os.getpid())
    assert own is not None and own > 0
    group = group_cpu_seconds(os.getpgid(0))
    assert group is not None and group >= own - 0.05
    assert process_cpu_seconds(2**22 + 12345) is None


def test_tables_show_every_record_and_the_overhead() -> None:
    samples = (_result(chunks=(0.01, 0.02), e2e=0.03, tokens=2),)
    base = summarize(samples)
    slower = summarize((_result(chunks=(0.02, 0.03), e2e=0.05, tokens=2),))

    def rec(system: str, summary: object, cpu: float | None) -> RunRecord:
        return RunRecord(system, "c=1", 1, None, True, summary, 0.1, cpu, samples)  # type: ignore[arg-type]

    records = [rec("direct", base, None), rec("gateway", slower, 1.5)]
    table = markdown_table(records)
    assert table.count("\n") == 4 and "| gateway | c=1 | yes | 1/1 |" in table
    over = overhead_table(records, "direct")
    assert "| gateway | c=1 | yes | +10.00 | +20.00 |" in over


def test_group_cpu_split_of_this_process_group() -> None:
    group = os.getpgid(0)
    split = group_cpu_split(group)
    assert split is not None and split[0] > 0 and split[1] >= 0
    total = group_cpu_seconds(group)
    assert total is not None and abs(total - sum(split)) < 0.05
    assert group_cpu_split(2**22 + 12345) is None
