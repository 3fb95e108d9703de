"""Load a model and its tokenizer once, on the device and dtype the config asks for.

Runs in a worker thread during ``HFBackend.start()``; never at import time.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from backends.base import BackendError
from backends.hf.loading.model_source import ModelSourceError, resolve_source
from backends.process_wide import exclusive
from backends.tool_markup.prompt import read_chat_template
from config.schema import HFModelConfig

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(BackendError):
    """The model or tokenizer could not be loaded."""


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    max_context: int
    memory_bytes: int
    eos_ids: frozenset[int]
    pad_id: int


def pick_device(spec: str) -> torch.device:
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {spec!r} requested but CUDA is not available")
    return device


def pick_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec != "auto":
        return _DTYPES[spec]
    # bf16 halves the weight traffic that bounds a decode step; on CPUs without bf16
    # matmul units (AMX / AVX512-BF16) it is emulated and slower than fp32 (docs/hf.md).
    if device.type == "cuda" or _cpu_has_bf16_units():
        return torch.bfloat16
    return torch.float32


def _cpu_has_bf16_units() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def threads_for(config: HFModelConfig) -> int:
    return config.threads or os.cpu_count() or 1


def load(config: HFModelConfig) -> LoadedModel:
    """Blocking; holds the process's load lock throughout (``backends.process_wide``)."""
    with exclusive(f"load of {config.name}"):
        return _load(config)


def _load(config: HFModelConfig) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        source = resolve_source(config.source)
    except ModelSourceError as exc:
        raise ModelLoadError(str(exc)) from exc
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    offline = {"local_files_only": True} if source.is_local else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.path_or_id, **offline)
        if config.chat_template is not None:
            tokenizer.chat_template = read_chat_template(config.chat_template)
        model = AutoModelForCausalLM.from_pretrained(source.path_or_id, dtype=dtype, **offline)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load {config.source!r}: {exc}") from exc
    model = model.to(device).eval()  # type: ignore[arg-type]
    model.requires_grad_(False)
    max_positions = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    max_context = min(config.max_context or max_positions, max_positions)
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        max_context=max_context,
        memory_bytes=_memory_bytes(model),
        eos_ids=eos,
        pad_id=int(pad),
    )


def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    found: set[int] = set()
    for raw in (
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if isinstance(raw, int):
            found.add(raw)
        elif isinstance(raw, list | tuple):
            found.update(int(x) for x in raw)
    if not found:
        raise ModelLoadError("the model defines no end-of-sequence token")
    return frozenset(found)


def _memory_bytes(model: Any) -> int:
    """Bytes of parameters and buffers, tied weights counted once."""
    seen: dict[int, int] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())
