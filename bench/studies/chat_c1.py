"""``make bench-c1``: one user chatting, llmso's hf engine against llama.cpp's own server
and vLLM-CPU.

    python -m bench.studies.chat_c1 [--out docs/benchmarks/chat_c1] [--rounds 5]
        [--llama-server .engines/llama-server/bin/llama-server]
        [--q4-0 FILE | --no-q4-0] [--no-vllm] [--systems hf-bf16,vllm-cpu-compiled] [--quick]

One user, one request at a time: streamed chat completions of six short prompts, greedy,
64 tokens each with ``ignore_eos`` (vLLM's extension; the gateway takes it and so does
llama-server), after one warm-up request. All systems serve the packaged
SmolLM2-135M-Instruct and stay resident; each is measured once per round, the order
rotating from round to round, and the others are SIGSTOPped meanwhile
(``bench.compare``'s rounds and ``pause_idle``):

- ``hf-int4`` / ``hf-w4a8`` / ``hf-bf16``: ``llmso serve`` (a config this writes), the hf
  continuous engine with the shipped defaults (prefix caching on) and ``quantization:
  int4`` (groups of 32 with a bf16 scale and zero each: Q4_1's layout and bits, 5 bits a
  weight), ``w4a8`` (Q4_1's grid times int8 activations, as llama.cpp computes; the LM
  head at 8 bits, as the GGUF stores it) or ``none``;
- ``llama-server-q4_1-np1`` / ``-np16``: llama.cpp's own server (``make llama-server``) on
  the Q4_1 GGUF the package ships (the file the bf16 folder is converted from), one slot
  and sixteen parallel slots;
- ``llama-server-q4_0-np1``: the same on a Q4_0 GGUF made from the bf16 folder with
  llama.cpp's converter and quantizer (``bench.llamacpp_gguf``; one fp16 scale per 32
  weights, no zero: 4.5 bits a weight, llama.cpp's fastest 4-bit type);
- ``vllm-cpu-compiled`` / ``vllm-cpu-eager`` (``.venv-vllm``, left out by ``--no-vllm``):
  vLLM-CPU's OpenAI server on the same bf16 folder as hf-bf16, prefix caching on as
  there, in its default mode (``torch.compile`` at start; the compile is start-up time,
  waited for and not measured) and with ``--enforce-eager``. Its API server and its
  EngineCore process share the process group the harness starts, so SIGSTOP pauses both.

``--systems`` runs only the named ones (a GGUF or binary only they need is then not
looked for).

Per system and round: tokens per second of waiting (output tokens over the requests'
end-to-end times), TTFT p50 and ITL p50; reported as the median over rounds, with each
llmso system's ratio to each peer as the median of its per-round ratios (a burst of noise
on a shared machine moves one round, not the figure). ``chat_c1.md`` / ``chat_c1.json``
hold that summary; ``results.md`` / ``results.json`` the pooled per-system tables and
every sample. Every request opens its own connection (``fresh_connections``). The ratios
pair each llmso system with each llama-server, and hf-bf16 (the same weights) with each
vLLM-CPU peer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp

from backends.hf.loading.model_source import gguf_behind, resolve_source
from bench.client import RequestResult
from bench.compare import run_compare
from bench.machine import machine_info, venv_package_version
from bench.report import RunRecord
from bench.spec import CompareSpec, SystemSpec
from bench.studies.llamacpp_gguf import ggufs
from bench.suites import DEFAULT_SOURCE, MODEL_NAME, hf_system, vllm_system

PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Write a haiku about autumn leaves.",
    "How do I reverse a list in Python?",
    "Why do cats purr?",
    "Suggest a name for a small bakery.",
)
REFERENCE = "llama-server-q4_1-np1"
"""The peer the issue's goal is stated against: llama.cpp on the same Q4 GGUF, one slot."""
LLMSO_SYSTEMS = ("hf-int4", "hf-w4a8", "hf-bf16")
Q4_0_PEER = "llama-server-q4_0-np1"
LLAMA_SERVERS = (REFERENCE, "llama-server-q4_1-np16", Q4_0_PEER)
VLLM_PEERS = ("vllm-cpu-compiled", "vllm-cpu-eager")
"""vLLM-CPU on the bf16 folder, its default (compiled) and eager: hf-bf16's peers."""
ALL_SYSTEMS = (*LLMSO_SYSTEMS, *LLAMA_SERVERS, *VLLM_PEERS)


@dataclass(frozen=True, slots=True)
class RoundFigures:
    """One system's figures in one round (its measured, successful requests)."""

    tok_per_s: float
    ttft_ms: float | None
    itl_ms: float | None
    requests: int


def llama_server_system(
    binary: Path, gguf: Path, label: str, *, slots: int, threads: int
) -> SystemSpec:
    """llama.cpp's own server on ``gguf`` with ``slots`` parallel slots (512 positions
    each: a short chat fits)."""
    return SystemSpec(
        label=label,
        command=(
            str(binary),
            "--model",
            str(gguf),
            "--alias",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--threads",
            str(threads),
            "--parallel",
            str(slots),
            "--ctx-size",
            str(512 * slots),
        ),
        base_url="http://127.0.0.1:{port}/v1",
        health_url="http://127.0.0.1:{port}/health",
        startup_timeout_s=120,
    )


def vllm_peer(root: Path, folder: Path, label: str) -> SystemSpec:
    """vLLM-CPU on the bf16 ``folder`` as ``label`` (``-eager``: ``--enforce-eager``), with
    hf-bf16's batch cap and prefix caching on, as there."""
    return vllm_system(
        root / ".venv-vllm",
        str(folder),
        label,
        dtype="bfloat16",
        max_seqs=16,
        prefix_caching=True,
        env={"VLLM_CPU_KVCACHE_SPACE": "2"},
        enforce_eager=label.endswith("-eager"),
    )


def fresh_connections(max_connections: int) -> aiohttp.ClientSession:
    """``bench.loadgen.new_session`` with one connection per request. llama-server (the
    llama.cpp of llama-cpp-python 0.3.36) closes the connection after every streamed
    response although it announced keep-alive; curl notices and reconnects, aiohttp writes
    the next request into the dead socket ("Can not write request body"), so every second
    request failed. A fresh loopback connection per request costs every system alike."""
    connector = aiohttp.TCPConnector(limit=max_connections, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


def split_rounds(samples: Sequence[RequestResult]) -> list[list[RequestResult]]:
    """A pooled record's samples cut back into its rounds: each round starts with its
    warm-up requests (``bench.compare.pooled`` concatenates the rounds in order)."""
    rounds: list[list[RequestResult]] = []
    previous_warm = False
    for sample in samples:
        if not rounds or (sample.warmup and not previous_warm):
            rounds.append([])
        rounds[-1].append(sample)
        previous_warm = sample.warmup
    return rounds


def round_figures(samples: Sequence[RequestResult]) -> RoundFigures:
    good = [s for s in samples if s.ok and not s.warmup]
    waited = sum(s.e2e for s in good)
    ttfts = [s.ttft * 1e3 for s in good if s.ttft is not None]
    gaps = [gap * 1e3 for s in good for gap in s.itls]
    return RoundFigures(
        tok_per_s=sum(s.output_tokens for s in good) / waited if waited else 0.0,
        ttft_ms=statistics.median(ttfts) if ttfts else None,
        itl_ms=statistics.median(gaps) if gaps else None,
        requests=len(good),
    )


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def compared(ours: str, peer: str) -> bool:
    """Whether the summary states ``ours`` against ``peer``: vLLM-CPU serves bf16 weights,
    so only hf-bf16 is set against it."""
    return peer not in VLLM_PEERS or ours == "hf-bf16"


def summary(records: Sequence[RunRecord]) -> dict[str, Any]:
    """Per system the median over rounds; per llmso system and peer it is compared with,
    the median of the per-round tok/s and ITL ratios."""
    rounds = {r.system: [round_figures(s) for s in split_rounds(r.samples)] for r in records}
    systems = {
        name: {
            "rounds": [asdict(f) for f in figures],
            "tok_per_s": _median([f.tok_per_s for f in figures]),
            "ttft_ms": _median([f.ttft_ms for f in figures]),
            "itl_ms": _median([f.itl_ms for f in figures]),
        }
        for name, figures in rounds.items()
    }
    ratios: dict[str, dict[str, dict[str, float | None]]] = {}
    peers = [name for name in rounds if name not in LLMSO_SYSTEMS]
    for ours in (name for name in LLMSO_SYSTEMS if name in rounds):
        for peer in (p for p in peers if compared(ours, p)):
            pairs = list(zip(rounds[ours], rounds[peer], strict=False))
            ratios.setdefault(ours, {})[peer] = {
                "tok_per_s": _median([a.tok_per_s / b.tok_per_s for a, b in pairs if b.tok_per_s]),
                "itl": _median([a.itl_ms / b.itl_ms for a, b in pairs if a.itl_ms and b.itl_ms]),
            }
    return {"systems": systems, "ratios": ratios}


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(result: dict[str, Any], spec: CompareSpec, meta: dict[str, Any]) -> str:
    lines = [
        f"# {spec.title}",
        "",
        "| system | tok/s (median of rounds) | TTFT p50 ms | ITL p50 ms | per-round tok/s |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["systems"].items():
        per_round = " / ".join(f"{r['tok_per_s']:.1f}" for r in row["rounds"])
        lines.append(
            f"| {name} | {_fmt(row['tok_per_s'])} | {_fmt(row['ttft_ms'])} "
            f"| {_fmt(row['itl_ms'])} | {per_round} |"
        )
    lines += [
        "",
        "Ratios, median of the per-round ratios (tok/s: above 1 is llmso faster; "
        "ITL: below 1 is llmso faster):",
        "",
        "| llmso | peer | tok/s ratio | ITL ratio |",
        "|---|---|---|---|",
    ]
    for ours, peers in result["ratios"].items():
        for peer, ratio in peers.items():
            lines.append(
                f"| {ours} | {peer} | {_fmt(ratio['tok_per_s'], '.2f')} "
                f"| {_fmt(ratio['itl'], '.2f')} |"
            )
    machine = meta["machine"]
    lines += [
        "",
        *(f"- {note}" for note in spec.notes),
        f"- machine: {machine['cpu_model']}, {machine['cpus_usable']} usable CPUs; load "
        f"average at start {machine['loadavg_at_start']}, at the end {meta['loadavg_at_end']}",
        f"- command: `{meta['command']}`; per-system tables and samples: results.md / results.json",
        "",
    ]
    return "\n".join(lines)


def selected(args: argparse.Namespace) -> tuple[str, ...]:
    """The systems this run measures: ``--systems`` (default all) less what ``--no-vllm``
    and ``--no-q4-0`` leave out."""
    left_out = {*(VLLM_PEERS if args.no_vllm else ()), *((Q4_0_PEER,) if args.no_q4_0 else ())}
    return tuple(label for label in args.systems or ALL_SYSTEMS if label not in left_out)


def system_labels(text: str) -> tuple[str, ...]:
    """An argparse type: known system labels, comma-separated."""
    labels = tuple(label.strip() for label in text.split(",") if label.strip())
    unknown = sorted(set(labels) - set(ALL_SYSTEMS))
    if not labels or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown systems {', '.join(unknown)}; known: {', '.join(ALL_SYSTEMS)}"
        )
    return labels


def q4_0_gguf(args: argparse.Namespace, folder: Path) -> Path | None:
    if Q4_0_PEER not in selected(args):
        return None
    if args.q4_0:
        return Path(args.q4_0)
    made = ggufs(
        folder, Path(args.gguf_convert_venv), Path(args.llamacpp_venv), ("q4_0",), "smollm"
    )
    return made["q4_0"]


def build_spec(
    args: argparse.Namespace,
    root: Path,
    prompts: Path,
    *,
    folder: Path,
    q4_1: Path,
    q4_0: Path | None,
) -> CompareSpec:
    """The run's spec: the ``selected`` systems, in ``ALL_SYSTEMS``' order."""
    threads = len(os.sched_getaffinity(0))
    binary = Path(args.llama_server)
    systems = [
        hf_system(
            root,
            label,
            "continuous",
            dtype="bfloat16",
            max_seqs=16,
            threads=threads,
            prefix_caching=True,
            quantization=setting,
        )
        for label, setting in zip(LLMSO_SYSTEMS, ("int4", "w4a8", "none"), strict=True)
    ]
    systems.append(llama_server_system(binary, q4_1, REFERENCE, slots=1, threads=threads))
    systems.append(
        llama_server_system(binary, q4_1, "llama-server-q4_1-np16", slots=16, threads=threads)
    )
    if q4_0 is not None:
        systems.append(llama_server_system(binary, q4_0, Q4_0_PEER, slots=1, threads=threads))
    systems += [vllm_peer(root, folder, label) for label in VLLM_PEERS]
    chosen = selected(args)
    vllm_version = venv_package_version(root / ".venv-vllm", "vllm", "vllm_cpu")
    return CompareSpec(
        title="One user chatting: SmolLM2-135M-Instruct, llmso hf int4 / w4a8 / bf16 vs "
        "llama-server and vLLM-CPU",
        model=MODEL_NAME,
        max_tokens=16 if args.quick else 64,
        ignore_eos=True,
        concurrency=(1,),
        min_requests=len(PROMPTS),
        requests_per_concurrency=len(PROMPTS),
        warmup=1,
        rounds=args.rounds,
        pause_idle=True,
        timeout_s=120,
        level_duration_s=None,
        prompts_file=str(prompts),
        notes=(
            f"llmso: `llmso serve`, hf continuous, {threads} torch threads, prefix caching "
            "on; hf-int4: int4 groups of 32 (bf16 scale + zero: Q4_1's bits); hf-w4a8: "
            "quantization w4a8 (docs/hf.md)",
            f"llama-server: {binary}, --threads {threads}, 512 positions per slot; "
            f"Q4_1: {q4_1.name} (the packaged file); "
            f"Q4_0: {q4_0.name if q4_0 else 'not run'} (made from the bf16 folder)",
            "requests: streamed chat, greedy, ignore_eos, "
            f"{16 if args.quick else 64} tokens, {len(PROMPTS)} short prompts per round "
            "after one warm-up; systems alternate round by round, idle ones SIGSTOPped "
            "(each one's whole process group)",
            f"vLLM-CPU: {vllm_version or 'not installed'}, bf16 folder {folder.name}, "
            "max_num_seqs 16, prefix caching on, VLLM_CPU_KVCACHE_SPACE=2, its own thread "
            "binding; vllm-cpu-compiled: its default (torch.compile at start, in the "
            "start-up seconds of results.md), vllm-cpu-eager: --enforce-eager",
            f"systems run: {', '.join(chosen)}",
        ),
        systems=tuple(s for s in systems if s.label in chosen),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/chat_c1"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llama-server", default=".engines/llama-server/bin/llama-server")
    parser.add_argument("--q4-0", help="a Q4_0 GGUF of the model (default: made here)")
    parser.add_argument("--no-q4-0", action="store_true", help="skip the Q4_0 peer")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM-CPU peers")
    known = ", ".join(ALL_SYSTEMS)
    parser.add_argument("--systems", type=system_labels, help=f"only these (of {known})")
    parser.add_argument("--gguf-convert-venv", default=".venv-gguf-convert")
    parser.add_argument("--llamacpp-venv", default=".venv-llamacpp", help="its quantizer")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 16-token answers")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.quick:
        args.rounds = min(args.rounds, 2)
    root = Path(__file__).resolve().parents[2]
    chosen = selected(args)
    if not chosen:
        parser.error("no system left to run")
    if set(chosen) & set(LLAMA_SERVERS) and not Path(args.llama_server).is_file():
        parser.error(f"{args.llama_server} not found: run `make llama-server`")
    if set(chosen) & set(VLLM_PEERS) and not (root / ".venv-vllm/bin/python").is_file():
        parser.error(".venv-vllm not found: run `make vllm` (or pass --no-vllm)")
    folder = Path(resolve_source(DEFAULT_SOURCE).path_or_id)
    q4_1 = gguf_behind(DEFAULT_SOURCE)
    if q4_1 is None:
        raise SystemExit(f"{DEFAULT_SOURCE} has no GGUF behind it")
    work = Path(tempfile.mkdtemp(prefix="llmso-chat-c1-"))
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    spec = build_spec(args, root, prompts, folder=folder, q4_1=q4_1, q4_0=q4_0_gguf(args, folder))
    command = " ".join(["python -m bench.studies.chat_c1", *sys.argv[1:]])
    meta: dict[str, Any] = {"command": command, "machine": machine_info()}
    meta["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with mock.patch("bench.compare.new_session", fresh_connections):
        records = asyncio.run(run_compare(spec, args.out, work, {"command": command}))
    meta["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result = summary(records)
    (args.out / "chat_c1.json").write_text(json.dumps({"meta": meta, **result}, indent=1) + "\n")
    (args.out / "chat_c1.md").write_text(markdown(result, spec, meta))
    print((args.out / "chat_c1.md").read_text())
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
