"""A model folder with a real config and tokenizer but seeded random weights.

``python -m bench.random_weights --config-dir DIR --out DIR [--seed 0] [--dtype bfloat16]``,
run by ``bench/gpu.sh`` when ``BENCH_GPU_RANDOM_WEIGHTS`` names a folder that holds a
model's ``config.json`` and tokenizer files but no weights: a machine without network that
cannot receive the packaged weights still runs the models suite on the model's exact
shapes. Speed with ``ignore_eos`` does not depend on the weights' values; the text they
produce is noise. The folder gets a marker file, and :func:`random_weights_note` turns it
into a line of the results, so a reader is never left to guess. torch and transformers are
imported inside :func:`build` so importing ``bench`` stays cheap.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

MARKER = "llmso-random-weights.json"
# Files that hold weights (or a whole model): never copied from the config folder.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".zip")


def random_weights_note(model_path: str) -> str | None:
    """A results line saying the folder's weights are random, or None for real weights."""
    marker = Path(model_path) / MARKER
    if not marker.is_file():
        return None
    info = json.loads(marker.read_text(encoding="utf-8"))
    return (
        f"weights: RANDOM (seed {info['seed']}, {info['dtype']}), not the trained model: "
        f"built from the config and tokenizer of {info['config_from']} by "
        "bench/random_weights.py; throughput and latency only, the generated text is noise"
    )


def build(config_dir: Path, out: Path, *, seed: int, dtype: str) -> Path:
    """Write ``out``: the config folder's files plus seeded random weights (safetensors).

    An ``out`` that already holds a marker for the same seed and dtype is reused; the
    folder appears whole or not at all (built next to it, then renamed).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    wanted = {"seed": seed, "dtype": dtype, "config_from": config_dir.name}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text(encoding="utf-8")) == wanted:
        return out
    if not (config_dir / "config.json").is_file():
        raise FileNotFoundError(f"{config_dir} has no config.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".random-weights-", dir=out.parent))
    try:
        for item in sorted(config_dir.iterdir()):
            if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(item, tmp / item.name)
        torch.manual_seed(seed)
        config = AutoConfig.from_pretrained(config_dir)
        model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=getattr(torch, dtype)
        )
        model.save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps(wanted) + "\n", encoding="utf-8")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.random_weights", description=__doc__)
    p.add_argument("--config-dir", type=Path, required=True, help="config.json + tokenizer.")
    p.add_argument("--out", type=Path, required=True, help="The model folder to write.")
    p.add_argument("--seed", type=int, default=0, help="torch's seed for the initial weights.")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    print(build(args.config_dir, args.out, seed=args.seed, dtype=args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
