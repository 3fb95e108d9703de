"""Per-step thread counts change how many threads run a step, not what it computes."""

from __future__ import annotations

import threading

import pytest
import torch

from backends.hf.loading.loader import load
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from backends.hf.model.step_threads import StepThreads
from tests.hf.helpers import config


def _greedy(runner: DecoderRunner, steps: int) -> tuple[list[list[int]], list[int]]:
    """Three prompts prefilled in one step (60 tokens), then ``steps`` decode steps of
    three rows; returns the greedy tokens and the thread count after each step."""
    chunks = [
        PrefillChunk(slot=s, tokens=tuple(range(300 + s, 320 + s)), start=0, want_logits=True)
        for s in range(3)
    ]
    logits = runner.forward([], [], chunks)
    counts = [torch.get_num_threads()]
    tokens = [[int(t)] for t in logits.argmax(-1)]
    for i in range(steps):
        logits = runner.forward([row[-1] for row in tokens], [20 + i] * 3, [])
        counts.append(torch.get_num_threads())
        for row, t in zip(tokens, logits.argmax(-1), strict=True):
            row.append(int(t))
    return tokens, counts


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16: what the bench serves
def test_adaptive_threads_keep_greedy_outputs(dtype: str) -> None:
    loaded = load(config(dtype=dtype))
    results: dict[str, tuple[list[list[int]], list[int]]] = {}

    def run() -> None:  # own thread: the count it sets cannot leak into other tests
        with torch.inference_mode():
            for name, threads in (("plain", None), ("adaptive", StepThreads(2, small_tokens=8))):
                torch.set_num_threads(2)
                runner = DecoderRunner(
                    loaded.model, max_slots=4, max_context=256, step_threads=threads
                )
                results[name] = _greedy(runner, steps=6)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert results["adaptive"][1] == [2] + [1] * 6  # prefill on both threads, decode on one
    assert results["plain"][1] == [2] * 7
    assert results["adaptive"][0] == results["plain"][0]
