"""lm-evaluation-harness itself against `llmso serve` (hf, the packaged SmolLM2 in bf16):
its ``local-completions`` client on 10 questions of the local task (docs/eval.md). The
full task, beside vLLM-CPU, is ``make eval-harness``.

Needs ``make lmeval``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

import pytest

from tests.drills.lm_eval_drill import HF_CONFIG, MODEL, direct_scores, run_lm_eval
from tests.tools.engines import model_folder, require_engine
from tests.tools.servers import gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("lmeval"), pytest.mark.slow]


def test_lm_evaluation_harness_scores_what_our_logprobs_say() -> None:
    """lm-evaluation-harness (local-completions) on 10 questions of the local task, on the
    bf16 server (as shipped): it completes, and its acc, acc_norm and per-choice
    log-likelihoods are what our echoed log-probabilities give directly."""
    require_engine("lmeval")
    with gateway(HF_CONFIG) as server:
        # One request at a time, as the direct scoring sends them: bf16 logits of a
        # prompt batched with others may differ in the last bits (a near tie could flip).
        harness = run_lm_eval(server.url, MODEL, model_folder(), limit=10, concurrent=1)
        direct = direct_scores(server.url, MODEL, limit=10)
    assert harness.acc == direct.acc and harness.acc_norm == direct.acc_norm
    for ours, theirs in zip(direct.loglikelihoods, harness.loglikelihoods, strict=True):
        assert ours == pytest.approx(theirs, abs=1e-3)
    assert harness.acc >= 0.3  # better than chance (0.25) on these easy questions
