"""The soak's short version in `make test` (the 60-minute run is `make soak`): mixed load
through two gateways sharing Redis while the chaos loop kills and restarts replicas,
restarts Redis, reloads the config and drops client streams. It must end with no 5xx that
an injected fault does not explain, and every answer charged what it generated (the
run's own exit status says both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.drills import soak

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_a_short_soak_has_no_unexplained_failures(tmp_path: Path) -> None:
    report = tmp_path / "soak.md"
    status = soak.main(
        [
            "--duration", "45",
            "--warmup", "10",
            "--concurrency", "3",
            "--chaos-interval", "8",
            "--report", str(report),
            "--label", "make test's short run",
        ]
    )  # fmt: skip
    text = report.read_text()
    assert status == 0, text
    assert "Unexplained 5xx / stream errors: **0**" in text
    assert " 0 differ by more than 1 " in text, "an answer was charged other than it generated"
