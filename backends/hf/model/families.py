"""The decoder families the packed runner (``packed_runner.py``) computes exactly, and what
differs between them, read from the model's config.

One runner serves them all; a family is only a set of switches (vLLM and nano-vllm draw
the same line: one engine, per-architecture pieces). What each switch reproduces:

- Llama, Mistral, Qwen2/2.5, Qwen3, Phi-3: RMSNorm ``x_hat * w``; Qwen2 projects q/k/v
  with a bias; Qwen3 normalises q and k per head before RoPE; Mistral and Phi-3 window
  every layer's attention (``sliding_window``); Phi-3 ships q/k/v and gate/up fused.
- Gemma, Gemma 2, Gemma 3: norms ``x_hat * (1 + w)`` computed in fp32, embeddings scaled
  by ``sqrt(hidden)``, GELU-tanh; Gemma 2/3 also norm the attention and MLP outputs
  ("sandwich"), alternate sliding-window and global layers (``layer_types``) and scale
  queries by ``query_pre_attn_scalar``; Gemma 2 soft-caps attention scores and final
  logits; Gemma 3 normalises q and k and gives local layers their own RoPE base.

Anything else (a RoPE that changes with the sequence length, bidirectional attention, a
layer kind this list does not know) is ``Unsupported`` with the reason, so the backend
can route the model to the generic path or refuse it; never a silent approximation.

Pure functions of a loaded model's config; no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FAST_MODEL_TYPES = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text"}
)
_GEMMA = frozenset({"gemma", "gemma2", "gemma3_text"})
_SANDWICH = frozenset({"gemma2", "gemma3_text"})
_QK_NORM = frozenset({"qwen3", "gemma3_text"})
# RoPE variants whose frequencies depend on the running sequence's length: one table
# precomputed for every position cannot reproduce them.
_LENGTH_DEPENDENT_ROPE = frozenset({"dynamic", "longrope"})
_LAYER_KINDS = frozenset({"full_attention", "sliding_attention"})


class Unsupported(Exception):
    """The model cannot be computed exactly by this path; the message says why."""


@dataclass(frozen=True, slots=True)
class Family:
    """Per-family switches of the packed forward (see the module docstring)."""

    model_type: str
    offset_norms: bool  # Gemma: x_hat * (1 + w), the product in fp32
    sandwich_norms: bool  # Gemma 2/3: norm after attention, before and after the MLP
    qk_norm: bool  # Qwen3, Gemma 3: RMSNorm over each head of q and k before RoPE
    scale: float  # attention score scale
    attn_softcap: float | None  # Gemma 2: cap * tanh(score / cap)
    final_softcap: float | None  # Gemma 2: the same on the logits
    windows: tuple[int | None, ...]  # per layer: keys kept are q - window < k <= q
    rope_kinds: tuple[str | None, ...]  # per layer: the rotary module's layer_type, if any


def rope_types(config: Any) -> set[str]:
    """Every RoPE type the config uses (Gemma 3 keeps one dict per layer kind)."""
    params = getattr(config, "rope_parameters", None) or {}
    if "rope_type" in params or not params:
        return {str(params.get("rope_type", "default"))}
    return {str((p or {}).get("rope_type", "default")) for p in params.values()}


def length_dependent_rope(config: Any) -> str | None:
    """The RoPE type that varies with sequence length, if the config uses one."""
    found = rope_types(config) & _LENGTH_DEPENDENT_ROPE
    return min(found) if found else None


def family_of(model: Any) -> Family:
    """The switches for ``model``; raises ``Unsupported`` naming the reason."""
    config = model.config
    kind = str(getattr(config, "model_type", "?"))
    if kind not in FAST_MODEL_TYPES:
        raise Unsupported(f"model type {kind!r} has no packed runner")
    rope = length_dependent_rope(config)
    if rope is not None:
        raise Unsupported(f"RoPE type {rope!r} depends on the sequence length")
    if getattr(config, "use_bidirectional_attention", False):
        raise Unsupported("bidirectional attention is not a decoder")
    layers = int(config.num_hidden_layers)
    windows, rope_kinds = _layer_pattern(model, kind, layers)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    scale = head_dim**-0.5
    if kind in _SANDWICH:
        scale = float(config.query_pre_attn_scalar) ** -0.5
    gemma2 = kind == "gemma2"
    return Family(
        model_type=kind,
        offset_norms=kind in _GEMMA,
        sandwich_norms=kind in _SANDWICH,
        qk_norm=kind in _QK_NORM,
        scale=scale,
        # transformers passes the attention cap only for Gemma 2 (Gemma 3 drops it)
        attn_softcap=_cap(config, "attn_logit_softcapping") if gemma2 else None,
        final_softcap=_cap(config, "final_logit_softcapping"),
        windows=windows,
        rope_kinds=rope_kinds,
    )


def _cap(config: Any, name: str) -> float | None:
    value = getattr(config, name, None)
    return float(value) if value else None


def _layer_pattern(
    model: Any, kind: str, layers: int
) -> tuple[tuple[int | None, ...], tuple[str | None, ...]]:
    config = model.config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if kind in {"mistral", "phi3"} or types is None:
        # these attend with config.sliding_window in every layer (None: no window)
        every = int(window) if window else None
        return (every,) * layers, (None,) * layers
    if not set(types) <= _LAYER_KINDS:
        raise Unsupported(f"layer types {sorted(set(types) - _LAYER_KINDS)} are not known")
    windows = tuple(int(window) if t == "sliding_attention" and window else None for t in types)
    per_kind = "layer_type" in _forward_parameters(model.model.rotary_emb)
    return windows, tuple(t if per_kind else None for t in types)


def _forward_parameters(module: Any) -> tuple[str, ...]:
    import inspect

    return tuple(inspect.signature(module.forward).parameters)
