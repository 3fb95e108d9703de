"""A tiny random-weight Qwen3 reasoning model, written to a folder an engine serves.

SmolLM2's tokenizer (the packaged model's) with ``<think>`` and ``</think>`` added as
tokens of their own (not special: they stay in the decoded text, as DeepSeek-R1's do),
and a chat template whose generation prompt opens the thought itself, as DeepSeek-R1's
does: served with ``--reasoning-parser deepseek_r1`` (or ``reasoning_parser:
deepseek_r1``), everything it writes before ``</think>`` is thought. ``head_dim`` 64:
vLLM-CPU refuses 16. Weights drawn with a wide init, so greedy choices are far from
ties and the same request gives the same text on every run.

Two more templates for the same model (a config's ``chat_template``): ``SWITCHED_TEMPLATE``
thinks only when ``enable_thinking`` asks (it opens the thought then, and closes it at
once when asked not to think, as Qwen3's does), so ``auto`` takes it for ``qwen3``;
``EFFORT_TEMPLATE`` is ``CHAT_TEMPLATE`` with a system line reading ``reasoning_effort``
(gpt-oss's template reads it too).
"""

from __future__ import annotations

from pathlib import Path

OPENS = "<think>"
CLOSES = "</think>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and m.get('reasoning_content') %}"
    "<think>\n{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
SWITCHED_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking %}<think>\n"
    "{% elif enable_thinking is defined %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
EFFORT_TEMPLATE = (
    "{% if reasoning_effort is defined %}<|im_start|>system\n"
    "Reasoning: {{ reasoning_effort }}<|im_end|>\n{% endif %}" + CHAT_TEMPLATE
)


def build(source: str, folder: Path, seed: int = 0, *, special: bool = False) -> Path:
    """Write the model (bf16) and its tokenizer into ``folder``; ``source`` is a folder
    holding SmolLM2's tokenizer. ``special``: the think tags are special tokens (a
    decoder that skips special tokens drops them), as harmony's markers are."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.add_tokens([OPENS, CLOSES], special_tokens=special)
    tokenizer.chat_template = CHAT_TEMPLATE
    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        initializer_range=0.2,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
