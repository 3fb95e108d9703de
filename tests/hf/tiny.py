"""Tiny random-weight decoders of each family, written to a folder the engine loads.

Each model is built by transformers from a config dict (no download), with a small
character-level BPE tokenizer trained here whose vocabulary fits the config. Weights are
drawn with a wide init so greedy choices are far from ties (fp32 rounding between two
exact implementations must not flip a token).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = 384
EOS = "<eos>"
_TEXT = [
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10; the quick brown fox jumps over the lazy dog.",
    "Water boils at one hundred degrees; ice melts at zero. Hello world!",
]
_BASE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
    "eos_token_id": 0,
    "bos_token_id": None,
    "pad_token_id": None,
}
# Turns alone, then the answer's start: enough for chat requests against random weights.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
WINDOW = 8  # sliding-window families: every test prompt runs well past it
_ALTERNATING = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    },
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True},
    "qwen3": {"model_type": "qwen3", "head_dim": 32},
    "mistral": {"model_type": "mistral", "sliding_window": WINDOW},
    "phi3": {
        "model_type": "phi3",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    },
    "gemma": {"model_type": "gemma", "tie_word_embeddings": True},
    "gemma2": {
        "model_type": "gemma2",
        "sliding_window": WINDOW,
        "layer_types": _ALTERNATING,
        "query_pre_attn_scalar": 24,
        "attn_logit_softcapping": 1.5,  # small, so the cap changes the scores
        "final_logit_softcapping": 3.0,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,  # the sqrt(hidden) embedding scale dominates otherwise
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "sliding_window": WINDOW,
        "layer_types": [
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        "query_pre_attn_scalar": 24,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        },
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
    },
}

# Not on the packed runner: served by transformers' own modules over the slot cache
# (GPT-NeoX, StableLM), or refused (Falcon's attention bypasses the interface).
GENERIC: dict[str, dict[str, Any]] = {
    "gpt_neox": {"model_type": "gpt_neox", "use_parallel_residual": True},
    "stablelm": {"model_type": "stablelm", "use_qkv_bias": True},
    "falcon": {"model_type": "falcon", "drop": ("head_dim",)},  # derived, not settable
}


def tokenizer() -> Any:
    """A character-level BPE over ``_TEXT`` with ``VOCAB`` entries (id 0 is ``EOS``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Metaspace()
    core.decoder = decoders.Metaspace()
    alphabet = sorted({chr(c) for c in range(32, 127)} | {"\u2581", "\n"})
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[EOS], initial_alphabet=alphabet, show_progress=False
    )
    core.train_from_iterator(_TEXT * 4, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build(family: str, folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random-weight ``family`` model (fp32) and the tokenizer into ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {**_BASE, **(FAMILIES.get(family) or GENERIC[family]), **overrides}
    for key in (*values.pop("drop", ()), "drop"):
        values.pop(key, None)
    kind = values.pop("model_type")
    config = AutoConfig.for_model(kind, **values)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # norms start at 1 (or Gemma's 0): vary them, so each is seen
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    model.generation_config.eos_token_id = 0
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


def reference(folder: Path, prompt: str, max_new_tokens: int) -> str:
    """transformers' own greedy ``generate()`` (eager attention: the one that applies
    every family's soft-capping), the new text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    # decoded after the prompt, as a stream is (a word-initial space stays)
    prompt_text = tok.decode(ids[0], skip_special_tokens=True)
    return str(tok.decode(out[0], skip_special_tokens=True))[len(prompt_text) :]
