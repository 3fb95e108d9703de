"""``make bench-shapes``: the hf engine and vLLM-CPU at the sizes people run on CPU.

    python -m bench.studies.shapes --out docs/benchmarks/shapes [--shapes qwen2.5-0.5b,llama-3.2-1b]
        [--concurrency 1,4,16] [--models-dir .models/shaped] [--no-vllm] [--quick]
        [--quantization int8,int4] [--llamacpp q8_0,q4_1] [--llamacpp-venv V]
        [--gguf-convert-venv V]

Nothing is downloaded: each model is written locally with random weights from the real
model's ``config.json`` values (below), in bfloat16, seed 0. Its tokenizer is the packaged
SmolLM2 byte-level BPE with its vocabulary extended, by tokens no merge produces, to the
config's ``vocab_size``, so every id the model can emit decodes and the LM head has the
real model's width. What differs from the real model: the weights (random, so the text is
noise and ``ignore_eos`` holds the length), the tokenizer (SmolLM2's merges: a prompt is a
different number of tokens than the real tokenizer would make) and the special token ids
(SmolLM2's). Shapes, dtypes, attention layout, RoPE settings and tied embeddings are the
real ones, and those set the cost of a step. (transformers 5 loads the qwen2 folder's
tokenizer as ``Qwen2Tokenizer``, whose pre-tokenizer splits some text, e.g. runs of
newlines, differently from SmolLM2's: a prompt can be a token shorter or longer there.)

Each shape runs the ``models`` suite's engines (``llmso-hf-continuous`` with the suite's
config: ``max_num_seqs`` 64, prefix caching off; ``vllm-cpu-compiled``, vLLM's default, and
``vllm-cpu``, eager), alternating per level, then writes ``bandwidth.md``: bytes read per
decode step at c = 1 (weights + KV at the mean context) divided by the measured time per
output token, beside a read probe run in the same process before and after
(``bench.studies.read_probe``), the machine's limit for a memory-bound decode.

``--quantization int8,int4`` adds the hf engine at each named weight-only setting
(``llmso-hf-int8``, ``llmso-hf-int4``; the same config otherwise), its bytes per step
counted at that setting's storage. ``--llamacpp q8_0,q4_1`` adds llama.cpp's server (the
venv given, one request at a time) on GGUFs of the same folder made by llama.cpp's own
converter and quantizer (``bench.studies.llamacpp_gguf``), its bytes per step the file's size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from backends.hf.loading.quantization import NONE, uniform
from bench.cli import positive_ints
from bench.compare import run_compare
from bench.report import RunRecord
from bench.spec import CompareSpec
from bench.studies.llamacpp_gguf import ggufs
from bench.studies.quant_serve import (
    GROUP,
    decode_context,
    llamacpp_note,
    llamacpp_system,
    step_weight_bytes,
)
from bench.studies.read_probe import ReadProbe, decode_step_bytes, probe_read_bandwidth
from bench.suites import models_suite

log = logging.getLogger(__name__)

SYSTEMS = ("llmso-hf-continuous", "vllm-cpu", "vllm-cpu-compiled")
_PLANS = {"int8": uniform("int8", GROUP), "int4": uniform("int4", GROUP)}
QUANTIZED = tuple(_PLANS)


@dataclass(frozen=True, slots=True)
class Shape:
    """A real model's architecture, without its weights."""

    name: str
    title: str
    config: dict[str, Any]


# The values of the real models' config.json (Qwen/Qwen2.5-0.5B-Instruct,
# meta-llama/Llama-3.2-1B-Instruct); token ids are replaced by SmolLM2's (see the module
# docstring).
SHAPES = {
    "qwen2.5-0.5b": Shape(
        "qwen2.5-0.5b",
        "Qwen2.5-0.5B-shaped (random weights)",
        {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "hidden_size": 896,
            "intermediate_size": 4864,
            "max_position_embeddings": 32768,
            "max_window_layers": 21,
            "num_attention_heads": 14,
            "num_hidden_layers": 24,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "use_sliding_window": False,
            "tie_word_embeddings": True,
            "vocab_size": 151936,
        },
    ),
    "llama-3.2-1b": Shape(
        "llama-3.2-1b",
        "Llama-3.2-1B-shaped (random weights)",
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "intermediate_size": 8192,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "num_attention_heads": 32,
            "num_hidden_layers": 16,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "vocab_size": 128256,
        },
    ),
}


def extend_tokenizer(tokenizer_json: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """A copy of a byte-level BPE ``tokenizer.json`` whose vocabulary has ``vocab_size``
    ids: the new ids are tokens no merge produces (they only ever decode)."""
    data: dict[str, Any] = json.loads(json.dumps(tokenizer_json))
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {item["id"] for item in data.get("added_tokens", ())}
    size = max([*vocab.values(), *added]) + 1
    if size > vocab_size:
        raise ValueError(f"tokenizer has {size} ids, more than the model's {vocab_size}")
    for token_id in range(size, vocab_size):
        # "Ġ" is the byte-level alphabet's space: these decode to " x<id>".
        vocab[f"\u0120x{token_id}"] = token_id
    return data


def write_shaped(shape: Shape, folder: Path, tokenizer_folder: Path) -> Path:
    """Write ``shape`` with random weights into ``folder`` (skipped when already there)."""
    if (folder / "model.safetensors").is_file() or any(folder.glob("*.safetensors")):
        return folder
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer_config = json.loads((tokenizer_folder / "tokenizer_config.json").read_text())
    smol = json.loads((tokenizer_folder / "config.json").read_text())
    values = {
        **shape.config,
        "bos_token_id": smol.get("bos_token_id"),
        "eos_token_id": smol.get("eos_token_id"),
        "dtype": "bfloat16",
    }
    config = AutoConfig.for_model(**{k: v for k, v in values.items() if k != "architectures"})
    config.architectures = shape.config["architectures"]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    scratch = Path(tempfile.mkdtemp(prefix=f"shaped-{shape.name}-", dir=folder.parent))
    try:
        model.save_pretrained(scratch)
        tokenizer = json.loads((tokenizer_folder / "tokenizer.json").read_text())
        extended = extend_tokenizer(tokenizer, int(shape.config["vocab_size"]))
        (scratch / "tokenizer.json").write_text(json.dumps(extended, ensure_ascii=False))
        (scratch / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        template = tokenizer_folder / "chat_template.jinja"
        if template.is_file():
            shutil.copy(template, scratch / template.name)
        scratch.rename(folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _quantized_saving(folder: Path, system: str, files: Mapping[str, Path] | None = None) -> int:
    """Bytes a step of ``system`` reads less than bf16: an ``llmso-hf-int*`` setting's, or
    a llama.cpp system's (``files``: its GGUF by label, read whole each step as quant_serve
    counts it); 0 for the bf16 systems."""
    gguf = (files or {}).get(system)
    if gguf is not None:
        return step_weight_bytes(folder, NONE) - gguf.stat().st_size
    plan = _PLANS.get(system.removeprefix("llmso-hf-"))
    if plan is None:
        return 0
    return step_weight_bytes(folder, NONE) - step_weight_bytes(folder, plan)


def bandwidth_rows(
    records: list[RunRecord],
    folder: Path,
    dtype: str,
    probes: tuple[ReadProbe, ...],
    files: Mapping[str, Path] | None = None,
) -> list[dict[str, Any]]:
    """Per system at c = 1: bytes read per decode step, time per output token, GB/s."""
    best = max(probe.gb_per_s for probe in probes)
    rows = []
    for record in records:
        summary = record.summary
        if record.concurrency != 1 or not summary.ok or summary.tpot_ms.p50 is None:
            continue
        context = decode_context(record, records)
        step = decode_step_bytes(folder, dtype, context_tokens=context)
        weights = step.weights - _quantized_saving(folder, record.system, files)
        gbs = (weights + step.kv) / (summary.tpot_ms.p50 / 1000) / 1e9
        rows.append(
            {
                "system": record.system,
                "weights_mb": weights / 1e6,
                "kv_mb": step.kv / 1e6,
                "tpot_p50_ms": summary.tpot_ms.p50,
                "achieved_gb_per_s": gbs,
                "probe_gb_per_s": best,
                "fraction_of_probe": gbs / best,
            }
        )
    return rows


def _markdown(shape: Shape, rows: list[dict[str, Any]], probes: tuple[ReadProbe, ...]) -> str:
    lines = [
        f"# {shape.title}: read bandwidth of a decode step at c = 1",
        "",
        "| system | weights read / step | KV read / step | TPOT p50 | achieved | probe "
        "| of probe |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['system']} | {row['weights_mb']:.0f} MB | {row['kv_mb']:.1f} MB "
            f"| {row['tpot_p50_ms']:.1f} ms | {row['achieved_gb_per_s']:.1f} GB/s "
            f"| {row['probe_gb_per_s']:.1f} GB/s | {row['fraction_of_probe']:.0%} |"
        )
    lines += [
        "",
        "Bytes per step: every weight the step reads (the tied embedding table once, as the "
        "LM head; an untied table's gather reads one row) plus K and V of every layer at the "
        "mean context (prompt + half the output). TPOT p50 is the step time a single stream "
        "sees (its inter-token time, which includes the server's per-token overhead).",
        "Probes (a float32 sum over a buffer larger than the last-level cache, torch, the "
        "gateway's thread count; before and after the runs): "
        + ", ".join(f"{p.gb_per_s:.1f} GB/s ({p.threads} threads, {p.mib} MiB)" for p in probes),
        "",
    ]
    return "\n".join(lines)


def _run_shape(args: argparse.Namespace, shape: Shape, root: Path) -> int:
    tokenizer_folder = Path(args.tokenizer_from)
    folder = write_shaped(shape, Path(args.models_dir) / shape.name, tokenizer_folder)
    out = Path(args.out) / shape.name
    threads = args.threads
    before = probe_read_bandwidth(threads)
    spec = models_suite(
        root,
        str(folder),
        quick=args.quick,
        concurrency=args.concurrency,
        include_vllm=not args.no_vllm,
        source=str(folder),
        title=shape.title,
        quantizations=args.quantization,
    )
    keep = {*SYSTEMS, *(f"llmso-hf-{setting}" for setting in args.quantization)}
    spec = spec.model_copy(
        update={"systems": tuple(s for s in spec.systems if s.label in keep), "baseline": None}
    )
    files = _llamacpp_files(args, folder)
    spec = _with_llamacpp(spec, args, files)
    work = Path(tempfile.mkdtemp(prefix=f"llmso-shapes-{shape.name}-"))
    log.info("%s: model %s, scratch %s", shape.name, folder, work)
    meta = {"command": " ".join(["python -m bench.studies.shapes", *sys.argv[1:]])}
    records = asyncio.run(run_compare(spec, out, work, meta))
    after = probe_read_bandwidth(threads)
    probes = (before, after)
    rows = bandwidth_rows(records, folder, "bfloat16", probes, files)
    (out / "bandwidth.json").write_text(
        json.dumps({"rows": rows, "probes": [asdict(p) for p in probes]}, indent=1) + "\n"
    )
    (out / "bandwidth.md").write_text(_markdown(shape, rows, probes))
    return 0 if records else 1


def _llamacpp_files(args: argparse.Namespace, folder: Path) -> dict[str, Path]:
    """The GGUF each llama.cpp system serves, by system label."""
    if not args.llamacpp:
        return {}
    made = ggufs(
        folder, Path(args.gguf_convert_venv), Path(args.llamacpp_venv), args.llamacpp, "smollm"
    )
    return {f"llamacpp-{ftype}": path for ftype, path in made.items()}


def _with_llamacpp(
    spec: CompareSpec, args: argparse.Namespace, files: dict[str, Path]
) -> CompareSpec:
    """``spec`` plus llama.cpp's server on each of ``files`` (one request at a time)."""
    if not files:
        return spec
    venv = Path(args.llamacpp_venv)
    threads = len(os.sched_getaffinity(0))
    systems = [llamacpp_system(venv, path, threads, label) for label, path in files.items()]
    note = (
        f"{llamacpp_note(venv, threads)}; GGUFs made by llama.cpp's convert_hf_to_gguf.py "
        f"(bf16) and llama_model_quantize ({', '.join(args.llamacpp)})"
    )
    return spec.model_copy(
        update={"systems": (*spec.systems, *systems), "notes": (*spec.notes, note)}
    )


def _ftypes(text: str) -> tuple[str, ...]:
    return tuple(part.lower() for part in text.split(",") if part)


def _settings(text: str) -> tuple[str, ...]:
    settings = tuple(part for part in text.split(",") if part)
    unknown = [s for s in settings if s not in QUANTIZED]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown setting(s) {unknown}; known: {QUANTIZED}")
    return settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/benchmarks/shapes")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--concurrency", type=positive_ints, default=(1, 4, 16))
    parser.add_argument("--models-dir", default=".models/shaped")
    parser.add_argument("--tokenizer-from", required=True, help="the packaged SmolLM2 folder")
    parser.add_argument("--threads", type=int, default=None, help="probe threads (all CPUs)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--quantization",
        type=_settings,
        default=(),
        help=f"comma-separated weight-only settings to add ({', '.join(QUANTIZED)})",
    )
    parser.add_argument(
        "--llamacpp",
        type=_ftypes,
        default=(),
        help="llama.cpp file types to serve beside (q8_0,q4_1,...: GGUFs made from the model)",
    )
    parser.add_argument("--llamacpp-venv", default=".venv-llamacpp-native")
    parser.add_argument("--gguf-convert-venv", default=".venv-gguf-convert")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Path(args.models_dir).mkdir(parents=True, exist_ok=True)
    root = Path.cwd()
    status = 0
    for name in args.shapes.split(","):
        if name not in SHAPES:
            parser.error(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
        status |= _run_shape(args, SHAPES[name], root)
    return status


if __name__ == "__main__":
    sys.exit(main())
