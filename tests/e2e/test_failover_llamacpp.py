"""Mid-stream failover with real engines, short: two llama.cpp replicas, two greedy
chat streams of 60 tokens whose serving replica is SIGKILLed at a random point, one
whose replica slips garbage into its stream, and one broken right after a delta that
tokenises otherwise when sent back as text (``tests/drills/failover_drill.py``; ``make
failover-trials`` runs 50 + 10 of 200 tokens, ``make failover-seams`` every such cut).
Each must end with ``[DONE]``, its text up to the seam the uninterrupted answer's, the
rest the engine's own greedy continuation of what was delivered (a garbled one may
instead end with the SSE error event, never with a clean wrong end).

Needs ``make llamacpp``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

import pytest

from tests.drills.failover_drill import run, summary
from tests.tools.engines import require_engine

pytestmark = [pytest.mark.e2e, pytest.mark.engine("llamacpp"), pytest.mark.slow]


def test_streams_survive_their_replica() -> None:
    require_engine("llamacpp")
    trials = run(kills=2, garbage=1, tokens=60, seed=3, seams=1)
    print(summary(trials))
    assert all(t.resumed for t in trials if t.kind == "kill"), trials
    assert all(t.passed for t in trials), trials
    # A cut where the delivered text tokenises otherwise: the answer is still the
    # uninterrupted one (the gateway withheld and regenerated the deltas after it).
    (seam,) = [t for t in trials if t.kind == "seam"]
    assert seam.identical and seam.carried_chars < seam.seam_chars, seam
