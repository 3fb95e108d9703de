"""The hf backend's memory estimate before loading, from its weight files' headers.

The estimate covers the weights (parameters x bytes of the dtype the engine will use) and,
for the continuous modes with prefix caching, the prefix pool at its full budget
(``prefix_cache_tokens`` x the KV bytes per token from ``config.json``); not the running
sequences' slot cache or activations: set ``memory_bytes`` in the config for a real budget.
Blocking file I/O: call from a worker thread. The registry asks through
``backends.factory.memory_estimate``.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path

from backends.hf.loading import model_source
from config.schema import HFModelConfig

log = logging.getLogger(__name__)

_SAFETENSORS_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_MAX_HEADER = 100 * 1024 * 1024


def estimate_memory_bytes(config: HFModelConfig) -> int:
    """Configured ``memory_bytes``, else the weights' size of a local folder (or of a
    GGUF's conversion once it ran), else 0."""
    if config.memory_bytes is not None:
        return config.memory_bytes
    try:
        folder = _local_folder(config.source)
        if folder is None:
            return 0
        pool = 0
        if config.prefix_caching and config.scheduling != "static" and config.task == "generate":
            pool = config.prefix_cache_tokens * kv_bytes_per_token(folder, config.dtype)
        return weights_bytes(folder, config.dtype) + pool
    except (OSError, ValueError) as exc:
        log.info("model %s: cannot estimate memory (%s); counting 0", config.name, exc)
        return 0


def weights_bytes(folder: Path, dtype: str = "auto") -> int:
    """Sum over ``*.safetensors`` headers (exact element counts), else ``*.bin`` sizes."""
    if any(folder.glob("*.safetensors")):
        return sum(tensor_bytes(folder, dtype).values())
    return sum(path.stat().st_size for path in folder.glob("*.bin"))


def tensor_bytes(folder: Path, dtype: str = "auto") -> dict[str, int]:
    """Each tensor's bytes in ``folder``'s ``*.safetensors`` headers, at ``dtype`` (or as
    stored for ``auto``)."""
    target = _DTYPE_BYTES.get(dtype)
    sizes: dict[str, int] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _MAX_HEADER:
                raise ValueError(f"{path.name}: implausible header length {length}")
            header = json.loads(handle.read(length))
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            count = math.prod(tensor["shape"])
            sizes[name] = count * (target or _SAFETENSORS_BYTES.get(tensor["dtype"], 1))
    return sizes


def kv_bytes_per_token(folder: Path, dtype: str = "auto") -> int:
    """layers x 2 x kv_heads x head_dim x element bytes from ``config.json``; 0 when the
    config does not say (the engine's real layout: ``SlotKVCache.bytes_per_token``)."""
    path = folder / "config.json"
    if not path.is_file():
        return 0
    cfg = json.loads(path.read_text(encoding="utf-8"))
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError):
        return 0
    element = _DTYPE_BYTES.get(dtype) or _DTYPE_BYTES.get(str(cfg.get("dtype")), 4)
    return layers * 2 * kv_heads * head_dim * element


def _local_folder(source: str) -> Path | None:
    """The folder ``resolve_source`` would load, without converting anything."""
    if source.startswith(model_source.PACKAGE_PREFIX):
        try:
            gguf = model_source.find_package_gguf(source[len(model_source.PACKAGE_PREFIX) :])
        except model_source.ModelSourceError:
            return None
        return _converted_folder(gguf, model_source.default_cache_dir())
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        return _converted_folder(path, model_source.default_cache_dir()) if path.is_file() else None
    return path if path.is_dir() else None


def _converted_folder(gguf: Path, cache_dir: Path) -> Path | None:
    """The conversion of ``gguf``, or None until it ran."""
    target = model_source.conversion_folder(gguf, cache_dir)
    return target if (target / "config.json").is_file() else None
