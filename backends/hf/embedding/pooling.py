"""A model folder's own pooling and normalisation, read from its sentence-transformers
config, and the pooling arithmetic itself.

sentence-transformers folders say how a sentence vector is made: ``modules.json`` lists
the pipeline (Transformer, Pooling, optionally Normalize), ``1_Pooling/config.json`` (or
wherever the Pooling module's ``path`` points) picks the mode, and
``sentence_bert_config.json`` caps the input length. We read the same files so our
vectors match ``SentenceTransformer.encode()``. A folder without ``modules.json`` gets
mean pooling and L2 normalisation, the common choice for embedding models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len", "lasttoken"]
_MODES: tuple[PoolingMode, ...] = ("cls", "mean", "max", "mean_sqrt_len", "lasttoken")
_ST = "sentence_transformers.models."


class PoolingConfigError(ValueError):
    """The folder's sentence-transformers config asks for something we do not do."""


@dataclass(frozen=True, slots=True)
class PoolingSpec:
    mode: PoolingMode
    normalize: bool
    max_seq_length: int | None = None


def read_pooling_spec(folder: Path) -> PoolingSpec:
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return PoolingSpec(mode="mean", normalize=True, max_seq_length=_max_seq_length(folder))
    modules: list[dict[str, Any]] = json.loads(modules_file.read_text())
    kinds = [str(module.get("type", "")).removeprefix(_ST) for module in modules]
    unknown = [kind for kind in kinds if kind not in {"Transformer", "Pooling", "Normalize"}]
    if unknown:
        raise PoolingConfigError(f"{folder}: unsupported sentence-transformers modules {unknown}")
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    mode: PoolingMode = "mean"
    if pooling is not None:
        mode = _pooling_mode(folder / str(pooling.get("path", "1_Pooling")) / "config.json")
    return PoolingSpec(
        mode=mode, normalize="Normalize" in kinds, max_seq_length=_max_seq_length(folder)
    )


def _pooling_mode(path: Path) -> PoolingMode:
    config: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    named = config.get("pooling_mode")  # newer sentence-transformers write the mode by name
    if isinstance(named, str):
        chosen = [named.removesuffix("_tokens").removesuffix("_token")]
    else:
        chosen = [
            mode
            for mode in _MODES
            if config.get(f"pooling_mode_{mode}_tokens")
            or config.get(f"pooling_mode_{mode}")
            or (mode == "cls" and config.get("pooling_mode_cls_token"))
        ]
    if not chosen:
        return "mean"
    if len(chosen) > 1 or chosen[0] not in _MODES:
        raise PoolingConfigError(f"{path}: unsupported pooling {chosen}")
    mode: PoolingMode = chosen[0]  # type: ignore[assignment]
    return mode


def _max_seq_length(folder: Path) -> int | None:
    path = folder / "sentence_bert_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_seq_length")
    return int(value) if isinstance(value, int) and value > 0 else None


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """One vector per row of ``hidden`` (batch, tokens, width); ``mask`` marks real
    tokens (1) against right padding (0)."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mask.sum(dim=1).long() - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if mode == "max":
        return hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    summed = (hidden * weights).sum(dim=1)
    counts = weights.sum(dim=1).clamp(min=1e-9)
    return summed / (counts.sqrt() if mode == "mean_sqrt_len" else counts)


def finish_vectors(
    vectors: torch.Tensor, *, normalize: bool, dimensions: int | None
) -> torch.Tensor:
    """Cut to ``dimensions`` (Matryoshka-style) and L2-normalise when the model does."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = torch.nn.functional.normalize(vectors, p=2.0, dim=1)
    return vectors
