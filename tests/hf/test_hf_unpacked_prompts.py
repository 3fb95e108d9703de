"""Weight-only int8 and int4 on PyTorch's kernels (``linears.Int8``, ``linears.Int4``;
where AMX is, int4 takes the tiles instead: ``test_hf_int4_tiles.py``) for a long
prompt's rows: the weights unpacked to bf16 (``csrc/unpack.c``) are the values PyTorch's
kernels multiply by, a prompt's rows on them keep their bits wherever they sit in a step,
and a long prompt at ``quantization: int8`` or ``int4`` gives the same logits alone and
packed with other rows."""

from __future__ import annotations

import pytest
import torch

from backends.hf.model import glue
from backends.hf.model.linears import UNPACKED_PROMPT_TOKENS, Int4, Int4Tiles, Int8, make_linear
from tests.hf.helpers import assert_quantized_prompt_packed_as_alone

pytestmark = pytest.mark.skipif(
    isinstance(glue.load(), str), reason="the C kernels are not built (make install)"
)


def _kernel_weights(linear: Int4, in_features: int) -> torch.Tensor:
    """``[out, in]`` as PyTorch's kernel multiplies: the kernel run on the identity."""
    eye = torch.eye(in_features, dtype=torch.bfloat16)
    bare = Int4(linear.packed, linear.scales_and_zeros, linear.group, linear.out_features, None, 0)
    return bare(eye).T


@pytest.mark.parametrize(("out_features", "group"), [(128, 32), (192, 64)])
def test_unpacked_int4_weights_are_the_values_its_kernel_multiplies(
    out_features: int, group: int
) -> None:
    torch.manual_seed(5)
    weight = torch.randn(out_features, 256, dtype=torch.bfloat16) * 0.05
    linear = Int4.of(weight, None, group, prompt_rows=True)
    assert linear.unpacked is not None
    assert torch.equal(linear.unpacked.unpack(), _kernel_weights(linear, 256))


def test_int4_unpacks_only_what_it_can() -> None:
    weight = torch.randn(96, 128, dtype=torch.bfloat16)  # 96 outputs: not blocks of 64
    assert Int4.of(weight, None, 32, prompt_rows=True).prompt_tokens is None
    wide = torch.randn(128, 128, dtype=torch.bfloat16)
    assert Int4.of(wide, None, 32).prompt_tokens is None  # as for the LM head
    assert Int4.of(wide.float(), None, 32, prompt_rows=True).prompt_tokens is None


def test_unpacked_int8_weights_are_the_values_its_kernel_multiplies() -> None:
    torch.manual_seed(4)
    weight = torch.randn(96, 128, dtype=torch.bfloat16) * 0.05
    linear = make_linear(weight, None, "int8", prompt_rows=True)
    assert isinstance(linear, Int8) and linear.unpacked is not None
    want = linear.weight.to(torch.bfloat16) * linear.scales[:, None]  # rounded once
    assert torch.equal(linear.unpacked.unpack(), want)
    assert make_linear(weight, None, "int8").prompt_tokens is None  # as for the LM head


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_prompts_rows_keep_their_bits_wherever_they_sit(scheme: str) -> None:
    torch.manual_seed(6)
    weight = torch.randn(192, 256, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(192, dtype=torch.bfloat16)
    linear = (
        Int4.of(weight, bias, 32, prompt_rows=True)
        if scheme == "int4"
        else make_linear(weight, bias, "int8", prompt_rows=True)
    )
    assert linear.prompt_tokens == UNPACKED_PROMPT_TOKENS
    x = torch.randn(300, 256, dtype=torch.bfloat16)
    other = torch.randn(9, 256, dtype=torch.bfloat16)
    packed = linear(x, fixed_from=3)
    assert torch.equal(packed[:3], linear(x[:3]))  # rows before: PyTorch's kernel
    moved = linear(torch.cat((other, x[3:])), fixed_from=5)
    assert torch.equal(moved[9:], packed[3:])
    assert torch.equal(linear(x[3:], fixed_from=0), packed[3:])
    # the same layer as the kernel's, up to bf16 rounding of the products' inputs
    exact = linear(x[3:]).double()
    assert float((packed[3:].double() - exact).abs().max()) < 0.05


@pytest.mark.parametrize(("scheme", "seed"), [("int8", 10), ("int4", 9)])
def test_a_long_prompt_gives_the_same_logits_whatever_shares_its_step(
    scheme: str, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Int4Tiles, "of", lambda *_, **__: None)  # as on a CPU without AMX
    assert_quantized_prompt_packed_as_alone(scheme, seed=seed)
