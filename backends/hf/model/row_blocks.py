"""How many rows one bf16 GEMM may take while every row still rounds as it would alone.

A sequence's logits must not depend on what else is in its step (the engine's promise:
batched == alone). oneDNN's bf16 GEMM keeps it on CPUs without AMX, but on an Intel Xeon
with AMX it picks its kernel by the number of rows: up to 32 rows every row is bitwise
what it is alone; from 33 rows on a few rows of each call round otherwise (measured on
SmolLM2's shapes: 1 to 7 of 33-40 rows, all 33 for the 49,152-row LM head), so a greedy
token at a near tie followed the batch. Capping oneDNN below AMX
(``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16``, what ``llmso serve`` did before) also kept the
promise, but made a decode step 1.1-1.9x and a prefill 2.0-4.1x slower than these row
blocks, which in turn cost 1.24x at 64 decode rows and 1.0-1.1x on a prompt against one
call (docs/benchmarks/row_blocks).

So each weight shape is probed once (``linears.Dense`` does, with the first weight of
that shape, at most 8,192 of its rows): the widest call (all rows, else 32, 16, ...
rows) whose every row equals that row computed alone, over call sizes from that width
down to 2. The projection then splits larger inputs into calls of that many rows. Where
the probe finds the whole input invariant (no AMX), it splits nothing.

Prefill rows need less: a prompt's tokens are prefilled the same way alone and in a
batch, so they need not round as one row alone does, only the same whatever shares their
call. oneDNN's AMX kernel for a call of a fixed size is such a kernel: a row's result
does not depend on where it sits in the call or on the other rows (its choices depend on
the size and the thread count). So the same probe also finds the widest fixed size
(128, else 64 rows) at which that holds, and which other multiples of 16 rows up to 512
give those rows the same results again (on SmolLM2's shapes most do from 48 rows; which
do not depends on the shape and the thread count). Steps of 16, not 64: a call's time
follows its rows, and the built-in benchmark prompts (39-262 tokens) padded to
multiples of 64 took 27 % more rows, to multiples of 16 from 48, 7 %. A prompt's rows
then run in calls of those sizes only: one call of the narrowest that holds them, else
calls of the widest, the last call padded with zero rows. Stateless.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PROBE_ROWS = 128  # far wider than the widest width tried: see invariant_width
_WIDTHS = (32, 16, 8, 4, 2)
FIXED_WIDTHS = (128, 64)  # base call sizes tried for a prompt's rows, widest first
MAX_FIXED_WIDTH = 512  # the widest call tried beside the base (the scheduler's chunk)
FIXED_STEP = 16  # the other sizes tried: multiples of this (AMX tiles hold 16 rows)
FIXED_PROBE_ROWS = 256  # rows compared per size and place (1 to 5 in 100 show a change)


def _calls_match_alone(
    call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, width: int, alone: torch.Tensor
) -> bool:
    """``x`` in calls of ``width``, ``width - 1``, half, 3 and 2 rows, repeating, each row
    compared bitwise with ``alone``."""
    sizes = [n for n in (width, width - 1, width // 2 + 1, 3, 2) if n >= 1]
    start, turn = 0, 0
    while start < x.shape[0]:
        end = min(start + sizes[turn % len(sizes)], x.shape[0])
        if not torch.equal(call(x[start:end]), alone[start:end]):
            return False
        start, turn = end, turn + 1
    return True


def invariant_width(call: Callable[[torch.Tensor], torch.Tensor], in_features: int) -> int | None:
    """The most rows one ``call`` may take with every row as it is alone; ``None``: any.

    Over ``PROBE_ROWS`` rows: where a wide call rounds otherwise, only a few rows in a
    hundred show it (on SmolLM2's 576 x 576 shape 1 to 3 of 48-100 rows), so 40 rows
    once passed a random weight of that shape as invariant."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, in_features, generator=generator, dtype=torch.bfloat16)
    alone = torch.cat([call(x[row : row + 1]) for row in range(PROBE_ROWS)])
    if torch.equal(call(x), alone):
        return None
    for width in _WIDTHS:
        if _calls_match_alone(call, x, width, alone):
            return width
    return 1


def _in_calls(
    call: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    size: int,
    offset: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """``call`` of ``x``'s rows placed ``offset`` rows into a run of other rows, the run
    cut into calls of ``size`` rows."""
    total = -(-(offset + x.shape[0]) // size) * size
    others = torch.randn(total - x.shape[0], x.shape[1], generator=generator, dtype=x.dtype)
    run = torch.cat((others[:offset], x, others[offset:]))
    out = torch.cat([call(run[start : start + size]) for start in range(0, total, size)])
    return out[offset : offset + x.shape[0]]


def fixed_widths(call: Callable[[torch.Tensor], torch.Tensor], in_features: int) -> tuple[int, ...]:
    """The call sizes at which each row gives the same result wherever it sits, whatever
    the other rows hold, and whichever of these sizes the call has: the widest base of
    ``FIXED_WIDTHS`` that keeps ``FIXED_PROBE_ROWS`` rows as they are when moved about
    its calls, with every multiple of ``FIXED_STEP`` up to ``MAX_FIXED_WIDTH`` whose calls
    give the same rows again (ascending; empty: no base does)."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(FIXED_PROBE_ROWS, in_features, generator=generator, dtype=torch.bfloat16)
    for base in FIXED_WIDTHS:
        reference = _in_calls(call, x, base, 0, generator)
        moved = (_in_calls(call, x, base, offset, generator) for offset in (1, 17, base // 2))
        if not all(torch.equal(rows, reference) for rows in moved):
            continue
        sizes = [base]
        for size in range(FIXED_STEP, MAX_FIXED_WIDTH + 1, FIXED_STEP):
            placed = (_in_calls(call, x, size, offset, generator) for offset in (5, size // 2))
            if size != base and all(torch.equal(rows, reference) for rows in placed):
                sizes.append(size)
        return tuple(sorted(sizes))
    return ()
