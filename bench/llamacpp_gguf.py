"""GGUF files of a local model folder, made with llama.cpp's own tools, for the benchmarks.

A user who wants llama.cpp on a Hugging Face checkpoint runs llama.cpp's
``convert_hf_to_gguf.py`` and then quantizes; so do we, with the converter of the same
llama-cpp-python source release as the server (``make gguf-convert``) and the server
venv's ``llama_model_quantize``. Files are cached beside the model folder
(``<folder>.<ftype>.gguf``) and made once.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

_TIMEOUT_S = 1800

# Runs in the converter venv. The shaped models carry SmolLM2's byte-level BPE, which
# llama.cpp knows as "smollm" by the hash of its tokens for a fixed text; but
# transformers loads a qwen2 folder's tokenizer as Qwen2Tokenizer, whose pre-tokenizer
# splits that text differently, so the converter's hash lookup fails. The pre-tokenizer is
# therefore named, not guessed.
_CONVERT = """
import runpy, sys
from pathlib import Path
source, pre = Path(sys.argv[1]), sys.argv[2]
sys.path[:0] = [str(source), str(source / "gguf-py")]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [str(source / "convert_hf_to_gguf.py"), *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

_QUANTIZE = """
import ctypes, sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3].upper())
params.nthread = 0
if llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)):
    raise SystemExit("llama_model_quantize failed")
"""


def gguf_path(folder: Path, ftype: str) -> Path:
    return folder.with_name(f"{folder.name}.{ftype}.gguf")


def convert(convert_venv: Path, folder: Path, pre_tokenizer: str) -> Path:
    """``folder`` as a bf16 GGUF (llama.cpp's converter; made once)."""
    out = gguf_path(folder, "bf16")
    if not out.is_file():
        scratch = out.with_suffix(".partial")
        log.info("converting %s to %s", folder, out)
        python = str(convert_venv / "bin/python")
        source = str(convert_venv / "src")
        cmd = [python, "-c", _CONVERT, source, pre_tokenizer, str(folder)]
        cmd += ["--outtype", "bf16", "--outfile", str(scratch)]
        subprocess.run(cmd, check=True, timeout=_TIMEOUT_S, capture_output=True)
        scratch.rename(out)
    return out


def quantize(llamacpp_venv: Path, bf16: Path, folder: Path, ftype: str) -> Path:
    """``bf16`` quantized to ``ftype`` (``q8_0``, ``q4_1``, ...: llama.cpp's names), once."""
    out = gguf_path(folder, ftype)
    if not out.is_file():
        scratch = out.with_suffix(".partial")
        log.info("quantizing %s to %s", bf16, out)
        cmd = [str(llamacpp_venv / "bin/python"), "-c", _QUANTIZE, str(bf16), str(scratch), ftype]
        subprocess.run(cmd, check=True, timeout=_TIMEOUT_S, capture_output=True)
        scratch.rename(out)
    return out


def ggufs(
    folder: Path,
    convert_venv: Path,
    llamacpp_venv: Path,
    ftypes: tuple[str, ...],
    pre_tokenizer: str,
) -> dict[str, Path]:
    """One GGUF of ``folder`` per llama.cpp file type, by type."""
    bf16 = convert(convert_venv, folder, pre_tokenizer)
    return {
        ftype: bf16 if ftype == "bf16" else quantize(llamacpp_venv, bf16, folder, ftype)
        for ftype in ftypes
    }
