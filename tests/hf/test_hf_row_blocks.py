"""bf16 on CPU: every projection of the packed runner gives each row what it gives that
row alone, however many rows share its call, on whatever CPU runs this (on AMX CPUs
through calls of at most 32 rows, ``backends/hf/model/row_blocks.py``)."""

from __future__ import annotations

import torch

from backends.hf.loading.loader import load
from backends.hf.model.linears import Dense
from backends.hf.model.packed_runner import DecoderRunner
from backends.hf.model.row_blocks import invariant_width
from tests.hf.helpers import config


def test_each_projection_rounds_a_row_as_it_would_alone() -> None:
    torch.set_num_threads(2)
    loaded = load(config(dtype="bfloat16"))
    with torch.inference_mode():
        runner = DecoderRunner(loaded.model, max_slots=4, max_context=512)
        layer = runner.layers[0]
        hidden = loaded.model.config.hidden_size
        projections = [
            (layer.qkv, hidden),
            (layer.o, hidden),  # SmolLM2: 9 heads x 64 = the hidden size
            (layer.gate_up, hidden),
            (layer.down, loaded.model.config.intermediate_size),
            (runner.lm_head, hidden),  # probed on its first 8,192 rows: all 49,152 here
        ]
        generator = torch.Generator().manual_seed(3)
        for projection, in_features in projections:
            assert isinstance(projection, Dense)
            x = torch.randn(77, in_features, generator=generator, dtype=torch.bfloat16)
            alone = torch.cat([projection(x[row : row + 1]) for row in range(77)])
            assert torch.equal(projection(x), alone), projection.row_block


def test_the_probe_finds_the_widest_call_that_keeps_rows_alone() -> None:
    weight = torch.randn(64, 32, dtype=torch.bfloat16)

    def exact(x: torch.Tensor) -> torch.Tensor:
        return (x.float() @ weight.float().T).to(torch.bfloat16)

    def wide_calls_round_otherwise(x: torch.Tensor) -> torch.Tensor:
        out = exact(x)  # as a kernel that switches past 8 rows would
        return out + 1 if x.shape[0] > 8 else out

    assert invariant_width(exact, 32) is None
    assert invariant_width(wide_calls_round_otherwise, 32) == 8
