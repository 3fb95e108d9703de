"""The generic path: a decoder without a packed runner (a tiny GPT-NeoX) still batches
continuously, a late request joining the running batch at the next step; a model that
neither path computes exactly is refused at load, naming why; ``static`` only when asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backends.hf.backend import HFBackend
from backends.hf.loading.loader import ModelLoadError
from tests.hf import tiny
from tests.hf.helpers import RecordingObserver, collect, completion, config

EARLY = [
    "The capital of France is Paris, and the",
    "def fibonacci(n): return",
    "Water boils at",
]
LATE = "Once upon a time, in a small village by the sea"
EARLY_TOKENS = 40
LATE_TOKENS = 8


async def test_late_request_joins_the_running_batch(tmp_path: Path) -> None:
    folder = tiny.build("gpt_neox", tmp_path / "neox")
    late_prompt_tokens = len(tiny.tokenizer()(LATE).input_ids)
    expected = tiny.reference(folder, LATE, LATE_TOKENS)
    observer = RecordingObserver()
    backend = HFBackend(config(source=str(folder), max_num_seqs=4), observer)
    await backend.start()
    try:
        alone = (await collect(backend.generate(completion(LATE, LATE_TOKENS)))).text()
        assert alone == expected
        before = len(observer.steps)
        early = [
            asyncio.ensure_future(collect(backend.generate(completion(p, EARLY_TOKENS))))
            for p in EARLY
        ]
        for _ in range(2000):  # until all three are decoding
            if any(step == (3, 3) for step in _steps(observer, before)):
                break
            await asyncio.sleep(0.005)
        submitted = len(observer.steps)
        late = (await collect(backend.generate(completion(LATE, LATE_TOKENS)))).text()
        results = await asyncio.gather(*early)
        assert late == alone
        assert all(r.usage.completion_tokens == EARLY_TOKENS for r in results)
        steps = _steps(observer, 0)
        # the step that admitted it: three decode rows plus its whole prompt
        joined = steps.index((4, 3 + late_prompt_tokens), submitted)
        assert joined <= submitted + 1  # the step running when it arrived, then this one
        assert steps[joined + 1] == (4, 4)  # then it decodes beside the others
    finally:
        await backend.stop()


def _steps(observer: RecordingObserver, since: int) -> list[tuple[int, int]]:
    with observer.lock:
        return [(size, tokens) for size, tokens, _ in observer.steps[since:]]


async def test_model_neither_path_computes_exactly_is_refused(tmp_path: Path) -> None:
    folder = tiny.build("falcon", tmp_path / "falcon")
    backend = HFBackend(config(source=str(folder)))
    with pytest.raises(ModelLoadError, match="attend through transformers' attention interface"):
        await backend.start()
    # static batching, when configured, runs it with transformers' own forward
    static = HFBackend(config(source=str(folder), scheduling="static", batch_window_ms=0))
    await static.start()
    try:
        text = (await collect(static.generate(completion(LATE, LATE_TOKENS)))).text()
        assert text == tiny.reference(folder, LATE, LATE_TOKENS)
        assert static.info().extra["scheduling"] == "static"
    finally:
        await static.stop()


async def test_length_dependent_rope_is_refused(tmp_path: Path) -> None:
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    folder = tiny.build("llama", tmp_path / "dynamic", rope_parameters=rope)
    with pytest.raises(ModelLoadError, match="'dynamic' depends on the sequence length"):
        await HFBackend(config(source=str(folder))).start()
