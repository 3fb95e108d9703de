"""The shaped models' tokenizer and the bytes a decode step reads (``bench.shapes``,
``bench.read_probe``)."""

from __future__ import annotations

import argparse
import json
import struct
from pathlib import Path

import pytest

from bench.read_probe import decode_step_bytes, probe_read_bandwidth
from bench.shapes import SHAPES, _quantized_saving, _settings, extend_tokenizer


def test_extended_vocabulary_has_the_models_width_and_keeps_the_merges() -> None:
    base = {
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
        "added_tokens": [{"id": 3, "content": "<eos>"}],
    }
    wide = extend_tokenizer(base, 10)
    ids = sorted(wide["model"]["vocab"].values())
    assert ids == [0, 1, 2, *range(4, 10)]  # 3 stays the added token's
    assert wide["model"]["merges"] == ["a b"] and base["model"]["vocab"] == {
        "a": 0,
        "b": 1,
        "ab": 2,
    }
    assert len(set(wide["model"]["vocab"])) == len(wide["model"]["vocab"])


def test_shapes_are_the_real_models_dimensions() -> None:
    qwen = SHAPES["qwen2.5-0.5b"].config
    assert (qwen["hidden_size"], qwen["num_hidden_layers"], qwen["vocab_size"]) == (896, 24, 151936)
    llama = SHAPES["llama-3.2-1b"].config
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["vocab_size"]) == (
        2048,
        16,
        128256,
    )
    assert llama["rope_scaling"]["rope_type"] == "llama3"


def _write(folder: Path, tensors: dict[str, list[int]], config: dict[str, object]) -> Path:
    header = {
        name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}
        for name, shape in tensors.items()
    }
    raw = json.dumps(header).encode()
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_step_reads_every_weight_and_the_kv_of_its_context(tmp_path: Path) -> None:
    config = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_size": 8,
        "vocab_size": 100,
        "tie_word_embeddings": True,
    }
    tensors = {"model.embed_tokens.weight": [100, 8], "model.layers.0.w": [8, 8]}
    tied = decode_step_bytes(
        _write(tmp_path / "tied", tensors, config), "bfloat16", context_tokens=10
    )
    assert tied.weights == (800 + 64) * 2  # the tied table is read whole, as the LM head
    assert tied.kv == 2 * 2 * 2 * 2 * 2 * 10  # layers x K,V x kv heads x head dim x bytes x tokens
    untied = {**tensors, "lm_head.weight": [100, 8]}
    step = decode_step_bytes(
        _write(tmp_path / "untied", untied, {**config, "tie_word_embeddings": False}),
        "bfloat16",
        context_tokens=0,
    )
    assert step.weights == (8 + 64 + 800) * 2 and step.total == step.weights  # one row gathered


def test_the_probe_reports_a_plausible_bandwidth() -> None:
    probe = probe_read_bandwidth(threads=1, mib=64, repeats=2)
    assert probe.threads == 1 and probe.mib == 64
    assert 0.1 < probe.gb_per_s < 2000


_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_PROJECTIONS += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def test_quantized_systems_count_their_projections_at_their_storage(tmp_path: Path) -> None:
    """``--quantization`` rows: int8 reads a byte a projection weight, int4 half a byte
    plus a bf16 scale and zero per group of 32; other systems read bf16."""
    tensors = {f"model.layers.0.{m}.weight": [64, 64] for m in _PROJECTIONS}
    folder = _write(tmp_path / "m", {"model.embed_tokens.weight": [100, 64], **tensors}, {})
    weights = 7 * 64 * 64
    assert _quantized_saving(folder, "llmso-hf-continuous") == 0
    assert _quantized_saving(folder, "vllm-cpu") == 0
    assert _quantized_saving(folder, "llmso-hf-int8") == weights * 2 - weights
    assert _quantized_saving(folder, "llmso-hf-int4") == weights * 2 - (weights // 2 + weights // 8)
    with pytest.raises(argparse.ArgumentTypeError, match="gguf"):
        _settings("int8,gguf")
    assert _settings("int8,int4") == ("int8", "int4")


def test_llamacpp_systems_read_their_gguf_file(tmp_path: Path) -> None:
    """``--llamacpp`` rows: a llama.cpp system reads its GGUF whole each step (as
    ``bench.quant_serve`` counts it); the others are not affected by the files given."""
    tensors = {f"model.layers.0.{m}.weight": [64, 64] for m in _PROJECTIONS}
    folder = _write(tmp_path / "m", {"model.embed_tokens.weight": [100, 64], **tensors}, {})
    gguf = tmp_path / "m.q4_1.gguf"
    gguf.write_bytes(b"\0" * 3000)
    dense = (100 * 64 + 7 * 64 * 64) * 2
    files = {"llamacpp-q4_1": gguf}
    assert _quantized_saving(folder, "llamacpp-q4_1", files) == dense - 3000
    assert _quantized_saving(folder, "llmso-hf-continuous", files) == 0
    assert _quantized_saving(folder, "llamacpp-q4_1") == 0
