"""The fleet hold drill's mechanics, short (``tests/drills/fleet.py``; ``make bench-fleet``
runs it in full): 64 GPU-speed streams, one round, directly and through ``llmso serve
--workers 2``. Every stream completes with all of its chunks, the two systems count the
same, the gateway's CPU is read, and the hold table has its row. No timing is asserted.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.compare import run_compare
from tests.drills.fleet import CHUNKS, ROOT, fleet_spec, hold_table

pytestmark = [pytest.mark.e2e]

STREAMS = 64


def test_64_gpu_speed_streams_hold_through_two_workers(tmp_path: Path) -> None:
    spec = fleet_spec(
        ROOT,
        concurrency=(STREAMS,),
        rounds=1,
        workers=(2,),
        peers=False,
        requests_per_concurrency=1,
        warmup=8,
    )
    records = asyncio.run(run_compare(spec, tmp_path / "out", tmp_path / "work"))
    by_system = {record.system: record for record in records}
    assert sorted(by_system) == ["direct", "llmso-w2"]
    for record in by_system.values():
        summary = record.summary
        assert summary.ok == summary.requests == STREAMS, record.system
        assert summary.output_tokens == STREAMS * CHUNKS, record.system
    assert by_system["llmso-w2"].server_cpu_ms_per_request is not None
    table = hold_table(records)
    row = next(line for line in table.splitlines() if line.startswith("| llmso-w2 "))
    assert f"| {STREAMS}/{STREAMS} |" in row
    assert (tmp_path / "out" / "results.json").exists()
