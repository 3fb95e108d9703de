"""``bench.inprocess_hop``: the in-process probe of the gateway's CPU per streamed request
serves real streamed answers through the app and reports a positive figure."""

from __future__ import annotations

from bench.inprocess_hop import measure


async def test_it_streams_through_the_app_and_reports_cpu() -> None:
    per_request_us = await measure(20, warmup=5)
    assert 1.0 < per_request_us < 1_000_000.0
