"""Random LoRA adapters made with PEFT, for the LoRA tests and the LoRA mixing study.

PEFT initialises ``B`` to zero, so a fresh adapter changes nothing; these adapters draw
``A`` and ``B`` at random (seeded), so an adapter visibly changes the base model's answers
and two seeds give two different adapters. torch, transformers and peft are imported
inside the function, so importing this module stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def random_adapter(
    base: str | Path,
    out: Path,
    targets: list[str],
    *,
    rank: int,
    seed: int,
    scale: float,
    dtype: str = "bfloat16",
    **extra: Any,
) -> Path:
    """A PEFT LoRA adapter of ``base`` with random ``A`` and ``B`` (``* scale``) on the
    modules ``targets``, saved to ``out``; ``extra`` goes to ``LoraConfig``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    lora = LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0, **extra
    )
    peft_model = get_peft_model(model, lora)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    peft_model.save_pretrained(str(out))
    return out
