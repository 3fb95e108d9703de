"""int4 on AMX tiles (``linears.Int4Tiles``, ``csrc/int4_amx.c``): the layer its integers
describe (the same integers, scales and zeros as PyTorch's kernel gets), a row's bits
whatever else is in its call, PyTorch's own AMX kernels' answers around its calls, the
choice between the two kernels, and a
long prompt's logits alone and packed on the runner. Skipped on a CPU without AMX,
where ``int4`` runs PyTorch's kernel (``test_hf_quantized.py``,
``test_hf_unpacked_prompts.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backends.hf.model import glue
from backends.hf.model.linears import (
    TILES_PROMPT_TOKENS,
    Int4,
    Int4Tiles,
    int4_values,
    make_linear,
    pack_int4_tiles,
)
from tests.hf.helpers import assert_quantized_prompt_packed_as_alone

_KERNEL = glue.load()
pytestmark = pytest.mark.skipif(
    isinstance(_KERNEL, str) or not _KERNEL.int4_amx_ready(),
    reason="no AMX here (or the C kernels are not built)",
)


def _tiles(out_features: int, in_features: int, group: int, *, seed: int) -> Int4Tiles:
    torch.manual_seed(seed)
    weight = torch.randn(out_features, in_features, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(out_features, dtype=torch.bfloat16)
    tiles = Int4Tiles.of(weight, bias, group)
    assert tiles is not None
    return tiles


@pytest.mark.parametrize(("out_features", "in_features", "group"), [(96, 128, 32), (256, 576, 64)])
def test_tiles_compute_the_layer_their_integers_describe(
    out_features: int, in_features: int, group: int
) -> None:
    torch.manual_seed(1)
    weight = torch.randn(out_features, in_features, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(out_features, dtype=torch.bfloat16)
    tiles = Int4Tiles.of(weight, bias, group)
    assert tiles is not None and tiles.prompt_tokens is None
    q, pairs = int4_values(weight, group)
    per_unit = pairs.reshape(in_features // group, out_features // 32, 32, 2).transpose(0, 1)
    assert torch.equal(tiles.scales_and_zeros, per_unit)
    assert torch.equal(tiles.packed, pack_int4_tiles(q))
    assert tiles.nbytes < weight.numel() * weight.element_size() / 3
    scale, zero = (pairs[..., i].float().T.repeat_interleave(group, dim=1) for i in (0, 1))
    dense = (q - 8).float() * scale + zero  # [out, in], as w = (q - 8) * scale + zero
    for rows in (1, 7, 40):
        x = torch.randn(rows, in_features, dtype=torch.bfloat16)
        want = x.double() @ dense.double().T + bias.double()
        got = tiles(x).double()
        # fp32 sums rounded once to bf16: within a bf16 step of the largest
        assert float((got - want).abs().max()) <= float(want.abs().max()) * 2**-7
        # PyTorch's kernel on the same integers: the same layer, rounded in another order
        pytorch = Int4.of(weight, bias, group)(x).double()
        assert float((got - pytorch).abs().max()) <= float(want.abs().max()) * 2**-7


def test_a_rows_bits_do_not_depend_on_its_call() -> None:
    tiles = _tiles(192, 256, 32, seed=2)
    x = torch.randn(300, 256, dtype=torch.bfloat16)
    every = tiles(x)
    for rows in (1, 3, 16, 17, 40):  # one tile of rows, several, and a part of one
        start = 300 - rows
        assert torch.equal(tiles(x[start:]), every[start:])
    strided = torch.randn(5, 512, dtype=torch.bfloat16)[:, ::2]
    assert torch.equal(tiles(strided)[2], tiles(strided[2:3].contiguous())[0])
    assert torch.equal(tiles(x[:3].reshape(1, 3, 256))[0], every[:3])


def test_a_long_prompts_rows_take_the_weights_pytorchs_int4_unpacks_to() -> None:
    torch.manual_seed(4)
    weight = torch.randn(192, 256, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(192, dtype=torch.bfloat16)
    tiles = Int4Tiles.of(weight, bias, 32, prompt_rows=True)
    assert tiles is not None and tiles.unpacked is not None
    assert tiles.prompt_tokens == TILES_PROMPT_TOKENS
    pytorch = Int4.of(weight, bias, 32, prompt_rows=True)
    assert pytorch.unpacked is not None
    assert torch.equal(tiles.unpacked.unpack(), pytorch.unpacked.unpack())
    x = torch.randn(300, 256, dtype=torch.bfloat16)
    packed = tiles(x, fixed_from=3)
    assert torch.equal(packed[:3], tiles(x[:3]))  # rows before: the tiles
    assert torch.equal(packed[3:], pytorch(x, fixed_from=3)[3:])
    moved = tiles(torch.cat((torch.randn(9, 256, dtype=torch.bfloat16), x[3:])), fixed_from=5)
    assert torch.equal(moved[9:], packed[3:])


def test_pytorchs_amx_kernels_answer_alike_around_tiles_calls() -> None:
    # PyTorch's CPU flash attention runs oneDNN's brgemm on AMX in the same threads (it
    # configures the tiles per call; a tiles call restores the thread's configuration
    # anyway, csrc/int4_amx.c says why)
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 4, 512, 64, dtype=torch.bfloat16) for _ in range(3))
    before = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tiles = _tiles(96, 128, 32, seed=3)
    for rows in (1, 20):
        tiles(torch.randn(rows, 128, dtype=torch.bfloat16))
        assert torch.equal(F.scaled_dot_product_attention(q, k, v, is_causal=True), before)


def test_int4_takes_the_tiles_where_they_fit() -> None:
    weight = torch.randn(96, 128, dtype=torch.bfloat16)
    assert isinstance(make_linear(weight, None, "int4", 32, prompt_rows=True), Int4Tiles)
    assert isinstance(make_linear(weight.float(), None, "int4", 32), Int4)  # not bf16
    assert isinstance(make_linear(weight[:48], None, "int4", 32), Int4)  # 48 outputs
    assert isinstance(make_linear(weight[:, :112], None, "int4", 16), Int4)  # groups of 16


def test_the_runner_says_its_int4_runs_on_the_tiles() -> None:
    from backends.hf.loading.loader import load
    from backends.hf.loading.quantization import uniform
    from backends.hf.model.packed_runner import DecoderRunner
    from tests.hf.helpers import config

    loaded = load(config(dtype="bfloat16"))
    plan = uniform("int4", 32)
    int4 = DecoderRunner(loaded.model, max_slots=2, max_context=64, quantization=plan)
    assert "int4 projections on AMX tiles" in int4.path
    assert "AMX tiles" not in DecoderRunner(loaded.model, max_slots=2, max_context=64).path


def test_a_long_prompt_gives_the_same_logits_whatever_shares_its_step() -> None:
    assert_quantized_prompt_packed_as_alone("int4", seed=12, lengths=(300, 260, 40))
