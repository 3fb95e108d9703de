"""bf16 on CPU with ``compile_attention``: the inductor-compiled decode attention gives
the matmul path's logits (to bf16 rounding noise: it sums in another order, so it is not
bitwise, which is why it is opt-in), and a run of real steps never recompiles it."""

from __future__ import annotations

import threading

import torch
import torch._dynamo.utils

from backends.hf.loading.loader import load
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.slot_attention import PrefillChunk
from backends.hf.model.step_threads import StepThreads
from tests.hf.helpers import config


def _logits(runner: DecoderRunner, impl: str, prompts: list[list[int]], steps: int) -> torch.Tensor:
    """Prefill, then ``steps`` decode steps fed fixed tokens (teacher-forced, so a near
    tie cannot send the two kernels down different continuations)."""
    runner.attention.decode_impl = runner.attention.decode_impl_long = impl
    chunks = [
        PrefillChunk(slot=s, tokens=tuple(p), start=0, want_logits=True)
        for s, p in enumerate(prompts)
    ]
    runner.forward([], [], chunks)
    lengths = [len(p) for p in prompts]
    out = []
    for step in range(steps):
        out.append(runner.forward([500 + step] * len(prompts), lengths, []))
        lengths = [n + 1 for n in lengths]
    return torch.stack(out)


def test_compiled_decode_attention_matches_the_matmuls_without_recompiling() -> None:
    torch.set_num_threads(1)
    loaded = load(config(dtype="bfloat16"))
    with torch.inference_mode():
        runner = DecoderRunner(loaded.model, max_slots=8, max_context=1024, compile_attention=True)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        assert graphs >= 1  # compiled (and warmed) at load
        # one row (its own guard), short batches, and a batch long enough for the long
        # kernel (rows x span >= LONG_DECODE_KEYS), over a cache that grew meanwhile
        cases = [
            [list(range(300, 340))],
            [list(range(200 + s, 230 + 9 * s)) for s in range(3)],
            [list(range(100 + s, 700 + s)) for s in range(7)],
        ]
        for prompts in cases:
            expected = _logits(runner, "matmul", prompts, steps=4)
            got = _logits(runner, "compiled", prompts, steps=4)
            # the same fp32 attention summed in another order: one-ulp differences in its
            # bf16 output, grown over 30 layers (measured: max 0.5, mean 0.06 on logits of ~10-20);
            # a wrong mask or layout moves logits by whole units
            diff = (got - expected).abs()
            assert diff.max().item() < 2.0 and diff.mean().item() < 0.25  # ~1 bf16 ulp
            # where the two pick different tokens it is a near tie: the token the compiled
            # kernel picks scores, under the matmuls, within the noise bound of their best
            # (a 12-row argmax agreement share flipped with the CPU: 0.83 on AMX hosts)
            picked = expected.gather(-1, got.argmax(-1, keepdim=True)).squeeze(-1)
            assert (expected.max(-1).values - picked).max().item() < 1.0
            same = (got.argmax(-1) == expected.argmax(-1)).float().mean().item()
            assert same >= 0.75
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_one_thread_steps_of_adaptive_threads_do_not_recompile_while_serving() -> None:
    # Inductor's C++ kernels bake the thread count: the runner warms the compiled kernel
    # at load on the count short steps run with (one), not in the first small request.
    results: dict[str, int] = {}

    def run() -> None:  # own thread: the counts it sets cannot leak into other tests
        torch.set_num_threads(2)
        loaded = load(config(dtype="bfloat16", threads=2))
        with torch.inference_mode():
            runner = DecoderRunner(
                loaded.model,
                max_slots=4,
                max_context=512,
                compile_attention=True,
                step_threads=StepThreads(2),
            )
            results["load"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            _logits(runner, "compiled", [list(range(300 + s, 340 + s)) for s in range(3)], 3)
            results["served"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert results["served"] == results["load"]
