"""bf16 on CPU: every projection of the packed runner gives each decode row what it gives
that row alone, however many rows share its call, on whatever CPU runs this (on AMX CPUs
through calls of at most 32 rows, ``backends/hf/model/row_blocks.py``), and each prefill
row of a long prompt the same whatever else shares its step (fixed-size calls)."""

from __future__ import annotations

import torch

from backends.hf.loading.loader import load
from backends.hf.model.linears import Dense, Linear
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.row_blocks import fixed_widths, invariant_width
from tests.hf.helpers import assert_prompt_packed_as_alone, config, random_tokens


def _runner() -> tuple[DecoderRunner, list[tuple[Linear, int]]]:
    """SmolLM2 in bf16 on 2 threads, and its first layer's projections with their input
    widths."""
    torch.set_num_threads(2)
    loaded = load(config(dtype="bfloat16"))
    runner = DecoderRunner(loaded.model, max_slots=6, max_context=512)
    layer = runner.layers[0]
    hidden = loaded.model.config.hidden_size
    return runner, [
        (layer.qkv, hidden),
        (layer.o, hidden),  # SmolLM2: 9 heads x 64 = the hidden size
        (layer.gate_up, hidden),
        (layer.down, loaded.model.config.intermediate_size),
    ]


def test_each_projection_rounds_a_row_as_it_would_alone() -> None:
    with torch.inference_mode():
        runner, projections = _runner()
        # the LM head: probed on its first 8,192 rows, all 49,152 here
        projections.append((runner.lm_head, projections[0][1]))
        generator = torch.Generator().manual_seed(3)
        for projection, in_features in projections:
            assert isinstance(projection, Dense)
            x = torch.randn(77, in_features, generator=generator, dtype=torch.bfloat16)
            alone = torch.cat([projection(x[row : row + 1]) for row in range(77)])
            assert torch.equal(projection(x), alone), projection.row_block


def test_the_probe_finds_the_widest_call_that_keeps_rows_alone() -> None:
    weight = torch.randn(64, 32, dtype=torch.bfloat16)

    def exact(x: torch.Tensor) -> torch.Tensor:
        # float64: bf16 products summed exactly in any order (an fp32 GEMM's sums
        # can follow its row count)
        return (x.double() @ weight.double().T).to(torch.bfloat16)

    def wide_calls_round_otherwise(x: torch.Tensor) -> torch.Tensor:
        out = exact(x)  # as a kernel that switches past 8 rows would
        return out + 1 if x.shape[0] > 8 else out

    assert invariant_width(exact, 32) is None
    assert invariant_width(wide_calls_round_otherwise, 32) == 8


def test_prefill_rows_round_the_same_whatever_shares_their_calls() -> None:
    with torch.inference_mode():
        _, projections = _runner()
        generator = torch.Generator().manual_seed(5)
        for projection, in_features in projections:
            assert isinstance(projection, Dense)
            x = torch.randn(300, in_features, generator=generator, dtype=torch.bfloat16)
            other = torch.randn(9, in_features, generator=generator, dtype=torch.bfloat16)
            alone = torch.cat([projection(x[row : row + 1]) for row in range(3)])
            packed = projection(x, fixed_from=3)
            assert torch.equal(packed[:3], alone)  # the decode rows, as alone
            moved = projection(torch.cat((other, x[3:])), fixed_from=5)
            assert torch.equal(moved[9:], packed[3:]), projection.prefill_sizes


def test_a_long_prompt_gives_the_same_logits_whatever_shares_its_step() -> None:
    prompt, short, other = random_tokens(7, 150, 20, 90)
    with torch.inference_mode():
        runner, _ = _runner()
        assert not runner.fixed_prefill(len(short))
        assert_prompt_packed_as_alone(runner, prompt, other, short)


def test_the_fixed_width_probe_wants_rows_independent_of_their_place() -> None:
    weight = torch.randn(64, 32, dtype=torch.bfloat16)

    def exact(x: torch.Tensor) -> torch.Tensor:
        return (x.double() @ weight.double().T).to(torch.bfloat16)

    def first_row_otherwise(x: torch.Tensor) -> torch.Tensor:
        out = exact(x)
        out[0] += 1  # as a kernel whose first row in a call rounds apart
        return out

    def wide_calls_otherwise(x: torch.Tensor) -> torch.Tensor:
        out = exact(x)
        return out + 1 if x.shape[0] > 256 else out

    assert fixed_widths(exact, 32) == tuple(range(16, 513, 16))
    assert fixed_widths(wide_calls_otherwise, 32) == tuple(range(16, 257, 16))
    assert fixed_widths(first_row_otherwise, 32) == ()


def test_a_prompt_takes_the_fixed_calls_once_it_needs_more_than_one_capped_call() -> None:
    weight = torch.zeros(8, 8, dtype=torch.bfloat16)
    with_64 = Dense(weight, None, False, 0, row_block=32, prefill_sizes=(64, 128))
    assert with_64.prompt_tokens == 33  # half a 64-row call, and two 32-row ones
    from_128 = Dense(weight, None, False, 0, row_block=32, prefill_sizes=(128, 256))
    assert from_128.prompt_tokens == 64  # half the narrowest call
    assert Dense(weight, None, False, 0, row_block=32).prompt_tokens is None
    assert Dense(weight, None, False, 0).prompt_tokens is None  # no cap: every row alike
