"""Every test process runs oneDNN as ``llmso serve`` does (``backends/hf/loading/isa.py``):
capped below AMX unless the environment names a cap, so a reference computed here in
bf16 (transformers, an in-process engine) rounds as the served gateway does."""

from backends.hf.loading.isa import cap_for_batch_invariance

cap_for_batch_invariance()
