"""The per-chunk study still runs as docs/benchmarks/overhead/per_chunk.md says: ``python
-m bench.studies.chunk_cost`` streams answers from the fake upstream through ``llmso
serve`` (it checks one answer's text itself and exits non-zero otherwise) and writes each
level's CPU per chunk, and with two ``--tokens`` the marginal cost of a chunk. Run as a
subprocess, as a reader would: nothing in ``tests/`` imports a study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_study_relays_every_chunk_and_reports_cpu(tmp_path: Path) -> None:
    out = tmp_path / "per_chunk.json"
    command = [sys.executable, "-m", "bench.studies.chunk_cost", "--streams", "3"]
    command += ["--tokens", "2,6", "--span-ms", "600", "--batches", "2", "--json", str(out)]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    readings = {r["tokens"]: r for r in result["readings"]}
    assert sorted(readings) == [2, 6]
    for tokens, reading in readings.items():
        assert reading["requests"] == 3 * 2 and reading["chunks"] == 6 * tokens
        assert reading["delay_ms"] == 600 / tokens
        # the role chunk, one frame per chunk (none merged at this pace), finish, [DONE]
        assert reading["frames_per_request"] == tokens + 3
        assert reading["cpu_s"] is not None and reading["cpu_us_per_chunk"] >= 0
    (marginal,) = result["marginal"]
    assert marginal["streams"] == 3 and "cpu_us_per_chunk" in marginal
