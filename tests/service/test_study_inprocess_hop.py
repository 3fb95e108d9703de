"""The in-process hop study still runs as docs/hop_profile.md says: ``python -m
bench.studies.inprocess_hop`` streams 16-delta answers through the gateway's app (it
checks the frames itself and exits non-zero otherwise) and prints the CPU per request.
Run as a subprocess, as a reader would: nothing in ``tests/`` imports a study."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_study_streams_through_the_app_and_reports_cpu() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.studies.inprocess_hop", "--requests", "20", "--warmup", "5"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = re.fullmatch(r"([0-9.]+) us CPU per streamed request\n", done.stdout)
    assert found is not None, done.stdout
    assert 1.0 < float(found[1]) < 1_000_000.0
