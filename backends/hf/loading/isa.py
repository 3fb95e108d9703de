"""Which instructions oneDNN may use for the engine's bf16 GEMMs: at most AVX512-BF16.

On a CPU with AMX, oneDNN runs a bf16 GEMM's full 16-row tiles on the AMX units and the
rows left over on AVX512, and the two round differently. Which rows are left over depends
on how many rows the step has, so a sequence's logits (and at a near tie its greedy
token) would depend on what else is in its batch: the engine's promise, batched == alone,
would not hold. Measured on an Intel Xeon with AMX: `tests/e2e/test_gateway_hf.py::
test_async_sdk_concurrent_requests[bfloat16]` fails with AMX and passes with oneDNN capped
at AVX512-BF16; on CPUs without AMX the cap changes nothing.

The cap is oneDNN's own setting, ``ONEDNN_MAX_CPU_ISA``, read once when its first
primitive is made, so it is set at process start (``llmso serve`` does), before any model
loads; a value already in the environment wins, so a user who prefers AMX's speed to
batch invariance sets ``ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX`` (docs/hf.md).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ISA_ENV = "ONEDNN_MAX_CPU_ISA"
BATCH_INVARIANT_ISA = "AVX512_CORE_BF16"


def cap_for_batch_invariance(environ: MutableMapping[str, str] | None = None) -> str:
    """Cap oneDNN below AMX unless the environment already names a cap; the cap in force.
    Call once at process start, before torch makes any oneDNN primitive."""
    env = os.environ if environ is None else environ
    return env.setdefault(ISA_ENV, BATCH_INVARIANT_ISA)
