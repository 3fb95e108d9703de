"""The integer-dot projections (``linears.IntDot``, ``csrc/int_dot.c``): what they compute,
that a row's bits do not depend on its batch or the thread count, that the vector
and the portable loops agree bitwise, and that a long prompt's rows, on the weights
unpacked to bf16, keep their bits whatever shares their step. The engine-level checks
(``quantization: w4a8`` batches and caches as the dense engine does) are in
``test_hf_quantized.py``."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from backends.hf.loading.quantization import uniform
from backends.hf.model import glue
from backends.hf.model.linears import (
    INT_DOT_SCHEMES,
    UNPACKED_PROMPT_TOKENS,
    IntDot,
    QuantizationError,
    int4_grid,
    int8_grid,
    make_linear,
)
from tests.hf.helpers import assert_quantized_prompt_packed_as_alone, config

pytestmark = pytest.mark.skipif(
    isinstance(glue.load(), str), reason="the C kernels are not built (make install)"
)


def _rounded(x: torch.Tensor, wide: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's activation rounding in torch: integers a ``[rows, groups, 32]``, d and
    X ``[rows, groups]``."""
    top = 32639.0 if wide else 127.0
    grouped = x.float().reshape(x.shape[0], -1, 32)
    amax = grouped.abs().amax(dim=-1)
    inv = torch.where(amax > 0, top / amax, torch.zeros_like(amax))
    a = torch.round((grouped * inv[..., None]).clamp(-top, top))
    return a.double(), (amax / top).double(), grouped.sum(dim=-1).double()


def _expected(weight: torch.Tensor, x: torch.Tensor, bits: int, wide: bool) -> torch.Tensor:
    """What the stored integers and scales describe, in float64."""
    a, d, xs = _rounded(x, wide)
    if bits == 4:
        q, s, m = int4_grid(weight)
        dots = torch.einsum("ogi,rgi->rog", q.double(), a)
        return (dots * s.double() * d[:, None, :]).sum(-1) + xs @ m.double().T
    q8, s8 = int8_grid(weight)
    dots = torch.einsum("ogi,rgi->rog", q8.double(), a)
    return (dots * s8.double() * d[:, None, :]).sum(-1)


@pytest.mark.parametrize("scheme", sorted(INT_DOT_SCHEMES))
def test_it_computes_what_its_integers_describe(scheme: str) -> None:
    torch.manual_seed(0)
    weight = torch.randn(48, 96) * 0.05
    x = torch.randn(5, 96) * torch.linspace(0.1, 3.0, 96)  # groups of unlike ranges
    x[0, :32] = 0.0  # an all-zero group: d = 0
    linear = make_linear(weight, None, scheme)  # type: ignore[arg-type]
    assert isinstance(linear, IntDot)
    got = linear(x).double()
    want = _expected(weight, x, linear.bits, linear.wide)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    # and that is close to the float layer: 4-bit weights within their rounding
    exact = x.double() @ weight.double().T
    error = ((got - exact).norm() / exact.norm()).item()
    assert error < (0.1 if linear.bits == 4 else 0.01), error


@pytest.mark.parametrize("scheme", sorted(INT_DOT_SCHEMES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_rows_bits_do_not_depend_on_its_batch_threads_or_isa(
    scheme: str, dtype: torch.dtype
) -> None:
    torch.manual_seed(1)
    weight = (torch.randn(80, 160) * 0.05).to(dtype)
    bias = torch.randn(80).to(dtype)
    linear = make_linear(weight, bias, scheme)  # type: ignore[arg-type]
    assert isinstance(linear, IntDot)
    x = torch.randn(37, 160).to(dtype)
    together = linear(x)
    assert together.dtype == dtype and together.shape == (37, 80)
    for rows in (1, 2, 3, 4, 5, 9, 16):
        assert torch.equal(linear(x[:rows]), together[:rows]), rows
    assert torch.equal(linear(x[7:8]), together[7:8])
    strided = torch.randn(37, 320).to(dtype)[:, ::2]  # rows with a stride
    assert torch.equal(linear(strided), linear(strided.contiguous()))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(linear(x), together)
    finally:
        torch.set_num_threads(before)
    kernel = glue.load()
    assert not isinstance(kernel, str)
    portable = kernel.int_dot(
        linear.packed, 160, 80, linear.bias, bits=linear.bits, wide=linear.wide, isa=0
    )
    assert torch.equal(portable(x), together)


def test_sixteen_bit_activations_round_finer_than_eight() -> None:
    torch.manual_seed(2)
    weight = torch.randn(64, 128) * 0.05
    x = torch.randn(8, 128)
    dense = x.double() @ _dequantized4(weight).double().T
    narrow = make_linear(weight, None, "w4a8")(x).double()
    wide = make_linear(weight, None, "w4a16")(x).double()
    # the same 4-bit weights: what is left is the activations' rounding
    assert (wide - dense).abs().max() < (narrow - dense).abs().max() / 50


def _dequantized4(weight: torch.Tensor) -> torch.Tensor:
    q, s, m = int4_grid(weight)
    return (q.float() * s.float()[..., None] + m.float()[..., None]).reshape(weight.shape)


def test_shapes_and_dtypes_it_cannot_take_are_refused() -> None:
    with pytest.raises(QuantizationError, match="multiple of 32"):
        make_linear(torch.randn(16, 48), None, "w4a8")
    with pytest.raises(QuantizationError, match="of 16"):
        make_linear(torch.randn(24, 64), None, "w4a8")
    with pytest.raises(QuantizationError, match="float16"):
        make_linear(torch.randn(16, 64).half(), None, "w4a8")


def test_the_w4a8_setting_and_its_plan() -> None:
    plan = uniform("w4a8", 32)
    # Q, K and V with 16-bit activations, the rest with 8; the LM head 8-bit weights
    assert plan.scheme(0, "qkv") == "w4a16" and plan.scheme(5, "down") == "w4a8"
    assert plan.scheme(3, "gate_up") == "w4a8" and plan.head == "w8a16"
    assert config(quantization="w4a8").quantization == "w4a8"
    with pytest.raises(ValidationError, match="groups of 32"):
        config(quantization="w4a8", quantization_group_size=64)


@pytest.mark.parametrize("bits", [4, 8])
def test_unpacked_weights_are_the_values_the_kernel_multiplies(bits: int) -> None:
    torch.manual_seed(3)
    weight = torch.randn(96, 128) * 0.05
    weight[5, 32:64] = 0.25  # a group of equal weights: s = 0
    linear = make_linear(weight.bfloat16(), None, "w4a8" if bits == 4 else "w8a16")
    assert isinstance(linear, IntDot)
    kernel = glue.load()
    assert not isinstance(kernel, str)
    got = kernel.int_dot_weights(linear.packed, 128, 0, 96, bits=bits)
    if bits == 4:
        q, s, m = int4_grid(weight.bfloat16())
        want = q.float() * s.float()[..., None] + m.float()[..., None]
    else:
        q8, s8 = int8_grid(weight.bfloat16())
        want = q8.float() * s8.float()[..., None]
    assert torch.equal(got, want.reshape(96, 128).bfloat16())
    portable = kernel.int_dot_weights(linear.packed, 128, 0, 96, bits=bits, isa=0)
    assert torch.equal(portable, got)
    assert torch.equal(kernel.int_dot_weights(linear.packed, 128, 32, 48, bits=bits), got[32:80])


def test_a_prompts_rows_on_unpacked_weights_keep_their_bits_wherever_they_sit() -> None:
    torch.manual_seed(4)
    weight = torch.randn(192, 256, dtype=torch.bfloat16) * 0.05
    bias = torch.randn(192, dtype=torch.bfloat16)
    assert make_linear(weight, bias, "w4a8").prompt_tokens is None  # as for the LM head
    linear = make_linear(weight, bias, "w4a8", prompt_rows=True)
    assert isinstance(linear, IntDot) and linear.prompt_tokens == UNPACKED_PROMPT_TOKENS
    x = torch.randn(300, 256, dtype=torch.bfloat16)
    other = torch.randn(9, 256, dtype=torch.bfloat16)
    packed = linear(x, fixed_from=3)
    assert torch.equal(packed[:3], linear(x[:3]))  # rows before: the integer kernel
    moved = linear(torch.cat((other, x[3:])), fixed_from=5)
    assert torch.equal(moved[9:], packed[3:])
    assert torch.equal(linear(x[3:], fixed_from=0), packed[3:])
    # bf16 activations times the 4-bit weights: closer to the float layer than the kernel
    exact = x[3:].double() @ _dequantized4(weight).double().T + bias.double()
    unpacked_error = (packed[3:].double() - exact).norm()
    assert unpacked_error < (linear(x[3:]).double() - exact).norm() / 2


def test_a_long_prompt_at_w4a8_gives_the_same_logits_whatever_shares_its_step() -> None:
    assert_quantized_prompt_packed_as_alone("w4a8", seed=8)
