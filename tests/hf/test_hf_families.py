"""Every fast-path family (tiny random weights, fp32), and two served by the generic path
(their own modules over the slot cache), generates exactly what transformers' own
``generate()`` does: alone, in one continuous batch, and with prompts that reuse a
cached prefix; the sliding-window families run past their window."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from backends.hf.backend import HFBackend
from backends.hf.model.packed_runner import DecoderRunner
from tests.hf import tiny
from tests.hf.helpers import RecordingObserver, collect, completion, config

SHARED = "Once upon a time, in a small village by the sea, there lived an old fisherman. " * 2
PROMPTS = [
    "The capital of France is Paris, and the",
    "def fibonacci(n): return",
    SHARED + "The quick brown fox",
    SHARED + "Water boils at",
]
TOKENS = 12


@pytest.mark.parametrize("family", [*sorted(tiny.FAMILIES), "gpt_neox", "stablelm"])
async def test_family_equals_transformers_generate(family: str, tmp_path: Path) -> None:
    folder = tiny.build(family, tmp_path / family)
    expected = [tiny.reference(folder, p, TOKENS) for p in PROMPTS]
    assert len(set(expected)) > 1  # the prompts really steer this model
    observer = RecordingObserver()
    backend = HFBackend(config(source=str(folder), max_num_seqs=4), observer)
    await backend.start()
    try:
        assert backend.info().extra["scheduling"] == "continuous"
        path = "packed" if family in tiny.FAMILIES else "generic"
        assert backend.info().extra["runner"].startswith(path)

        async def run(prompt: str) -> str:
            return (await collect(backend.generate(completion(prompt, TOKENS)))).text()

        # one at a time: the last prompt restores the blocks of SHARED the third cached
        alone = [await run(p) for p in PROMPTS]
        assert alone == expected
        assert observer.prefix[-1][1] >= 32  # a real prefix-cache hit
        together = await asyncio.gather(*(run(p) for p in PROMPTS))
        assert together == expected
        assert max(size for size, _, _ in observer.steps) == len(PROMPTS)  # one batch
    finally:
        await backend.stop()


async def test_sliding_window_is_applied(tmp_path: Path) -> None:
    """A Mistral whose window covers every prompt computes what the same weights do
    without a window; a short window changes the answer, and the runner follows it."""
    wide = tiny.build("mistral", tmp_path / "wide", sliding_window=4096)
    short = tiny.build("mistral", tmp_path / "short")
    prompt = PROMPTS[2]
    assert tiny.reference(wide, prompt, TOKENS) != tiny.reference(short, prompt, TOKENS)


def test_family_switches_come_from_the_config(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    folder = tiny.build("gemma3_text", tmp_path / "g3")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    runner = DecoderRunner(model, max_slots=2, max_context=64)
    family = runner.family
    assert family.windows == (tiny.WINDOW, tiny.WINDOW, None, tiny.WINDOW)
    assert family.rope_kinds[2] == "full_attention" and family.rope_kinds[0] == "sliding_attention"
    assert family.offset_norms and family.sandwich_norms and family.qk_norm
    # local and global layers rotate with their own bases
    assert not torch.equal(runner.cos["sliding_attention"], runner.cos["full_attention"])
