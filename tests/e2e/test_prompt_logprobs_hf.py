"""Prompt log-probabilities over HTTP: `llmso serve` with the packaged SmolLM2 in bf16.

- echo + logprobs with ``max_tokens`` 0 and a token-id prompt (what lm-evaluation-harness
  sends): OpenAI's legacy shape, the first token ``null``;
- vLLM's ``prompt_logprobs``: each token within 0.05 nats of transformers' own bf16
  forward on the same weights;
- lm-evaluation-harness itself (``local-completions``) on 10 questions of the local task:
  it completes, and its accuracy and per-choice log-likelihoods are what our endpoint's
  echoed log-probabilities give directly.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.lm_eval_drill import HF_CONFIG, MODEL, direct_scores, run_lm_eval
from tests.tools.engines import model_folder, require_engine
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

PROMPT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with gateway(HF_CONFIG) as running:
        yield running


def complete(server: RunningServer, **body: object) -> dict[str, object]:
    response = httpx.post(
        server.url + "/v1/completions", json={"model": MODEL, **body}, timeout=120.0
    )
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_echo_logprobs_of_a_token_id_prompt(server: RunningServer) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_folder())(PROMPT)["input_ids"]
    body = complete(server, prompt=[ids, ids], echo=True, logprobs=2, max_tokens=0)
    first, second = body["choices"]  # type: ignore[misc]
    logprobs = first["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) and first["finish_reason"] == "length"
    assert first["text"] == "".join(logprobs["tokens"]) == PROMPT
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(v < 0 for v in logprobs["token_logprobs"][1:])
    rest = (logprobs["tokens"][1:], logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:])
    for token, value, top in zip(*rest, strict=True):
        assert top[token] == value and 2 <= len(top) <= 3  # the top 2 and the token itself
    assert logprobs["text_offset"][:2] == [0, len(logprobs["tokens"][0])]
    assert second["logprobs"] == logprobs
    assert body["usage"] == {  # type: ignore[comparison-overlap]
        "prompt_tokens": 2 * len(ids),
        "completion_tokens": 0,
        "total_tokens": 2 * len(ids),
    }
    # One generated token after the echoed prompt (lm-evaluation-harness's max_tokens 1).
    one = complete(server, prompt=PROMPT, echo=True, logprobs=1, max_tokens=1, temperature=0)
    choice = one["choices"][0]  # type: ignore[index]
    assert choice["text"].startswith(PROMPT) and len(choice["text"]) > len(PROMPT)
    assert choice["logprobs"]["token_logprobs"][: len(ids)] == logprobs["token_logprobs"]
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 1


def test_prompt_logprobs_equal_transformers_bf16(server: RunningServer) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = model_folder()
    ids = AutoTokenizer.from_pretrained(folder)(PROMPT, return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        expected = model(ids).logits[0].float().log_softmax(-1)
    body = complete(server, prompt=PROMPT, prompt_logprobs=1, max_tokens=1, temperature=0)
    scored = body["choices"][0]["prompt_logprobs"]  # type: ignore[index]
    assert scored[0] is None and len(scored) == ids.shape[1]
    for position in range(1, ids.shape[1]):
        token = int(ids[0, position])
        entry = scored[position][str(token)]
        want = float(expected[position - 1, token])
        assert abs(entry["logprob"] - want) <= 0.05, (position, entry, want)
        assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
        assert 1 <= len(scored[position]) <= 2


def test_lm_evaluation_harness_scores_what_our_logprobs_say(server: RunningServer) -> None:
    require_engine("lmeval")
    # One request at a time, as the direct scoring sends them: bf16 logits of a prompt
    # batched with others may differ in the last bits, which can flip a near tie.
    harness = run_lm_eval(server.url, MODEL, model_folder(), limit=10, concurrent=1)
    direct = direct_scores(server.url, MODEL, limit=10)
    assert harness.acc == direct.acc and harness.acc_norm == direct.acc_norm
    for ours, theirs in zip(direct.loglikelihoods, harness.loglikelihoods, strict=True):
        assert ours == pytest.approx(theirs, abs=0.05)
    assert harness.acc >= 0.3  # better than chance (0.25) on these easy questions
