"""GGUF files of a local model folder, made with llama.cpp's own tools, for the benchmarks.

A user who wants llama.cpp on a Hugging Face checkpoint runs llama.cpp's
``convert_hf_to_gguf.py`` and then quantizes; so do we, with the converter of the same
llama-cpp-python source release as the server (``make gguf-convert``) and the server
venv's ``llama_model_quantize``. Files are cached beside the model folder
(``<folder>.<ftype>.gguf``) and made once.

    python -m bench.studies.llamacpp_gguf --check <folder> [<folder> ...] --out <file.json>
        [--ftypes bf16,q8_0] [--llamacpp-venv .venv-llamacpp-native]

checks that a GGUF made here is the same model: llama.cpp's logits over a short prompt
against transformers' (fp32) on the folder, per position (argmax agreement, correlation).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# Runs in the llama.cpp venv: the logits of every position of argv[2]'s token ids.
_LOGITS = """
import json, sys
import numpy as np
import llama_cpp
ids = json.loads(sys.argv[2])
model = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, logits_all=True, verbose=False)
model.eval(ids)
np.save(sys.argv[3], np.array(model.scores[: len(ids)], dtype=np.float32))
"""
_CHECK_TEXT = "The quick brown fox jumps over the lazy dog. It was a sunny day"


def gguf_path(folder: Path, ftype: str) -> Path:
    return folder.with_name(f"{folder.name}.{ftype}.gguf")


def _made_once(out: Path, command: Callable[[Path], list[str]]) -> Path:
    """``out``, made by running ``command(scratch)`` unless it exists; renamed into place
    only once whole, so an interrupted run leaves no half file under the cached name."""
    if out.is_file():
        return out
    scratch = out.with_suffix(".partial")
    log.info("making %s", out)
    done = subprocess.run(
        command(scratch),
        check=False,
        timeout=_TIMEOUT_S,
        capture_output=True,
        encoding="utf-8",
        errors="replace",
    )
    if done.returncode:
        raise RuntimeError(f"making {out} failed ({done.returncode}): {done.stderr[-2000:]}")
    scratch.rename(out)
    return out


def convert(convert_venv: Path, folder: Path, pre_tokenizer: str) -> Path:
    """``folder`` as a bf16 GGUF (llama.cpp's converter; made once)."""
    python, source = str(convert_venv / "bin/python"), str(convert_venv / "src")
    script = [python, "-c", _CONVERT, source, pre_tokenizer, str(folder), "--outtype", "bf16"]
    return _made_once(
        gguf_path(folder, "bf16"), lambda scratch: [*script, "--outfile", str(scratch)]
    )


def quantize(llamacpp_venv: Path, bf16: Path, folder: Path, ftype: str) -> Path:
    """``bf16`` quantized to ``ftype`` (``q8_0``, ``q4_1``, ...: llama.cpp's names), once."""
    python = str(llamacpp_venv / "bin/python")
    return _made_once(
        gguf_path(folder, ftype),
        lambda scratch: [python, "-c", _QUANTIZE, str(bf16), str(scratch), ftype],
    )


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


def check(folder: Path, llamacpp_venv: Path, ftypes: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per file type: llama.cpp's logits on ``_CHECK_TEXT`` against transformers' (fp32)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = list(AutoTokenizer.from_pretrained(folder)(_CHECK_TEXT)["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.inference_mode():
        reference = model(torch.tensor([ids])).logits[0].numpy()
    rows = []
    for ftype in ftypes:
        with tempfile.TemporaryDirectory() as scratch:
            out = Path(scratch) / "logits.npy"
            cmd = [str(llamacpp_venv / "bin/python"), "-c", _LOGITS, str(gguf_path(folder, ftype))]
            subprocess.run([*cmd, json.dumps(ids), str(out)], check=True, timeout=_TIMEOUT_S)
            logits = np.load(out)
        rows.append(
            {
                "model": folder.name,
                "ftype": ftype,
                "positions": len(ids),
                "argmax_agreement": float((logits.argmax(-1) == reference.argmax(-1)).mean()),
                "correlation": float(np.corrcoef(logits.ravel(), reference.ravel())[0, 1]),
                "max_abs_diff": float(np.abs(logits - reference).max()),
                "reference_std": float(reference.std()),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ftypes", type=lambda t: tuple(t.split(",")), default=("bf16", "q8_0"))
    parser.add_argument("--llamacpp-venv", type=Path, default=Path(".venv-llamacpp-native"))
    args = parser.parse_args(argv)
    rows = [row for folder in args.check for row in check(folder, args.llamacpp_venv, args.ftypes)]
    command = " ".join(["python -m bench.studies.llamacpp_gguf", *sys.argv[1:]])
    args.out.write_text(
        json.dumps({"command": command, "text": _CHECK_TEXT, "rows": rows}, indent=1) + "\n"
    )
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
