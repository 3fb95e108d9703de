"""The models suite on a CUDA machine: the hf continuous engine vs vLLM (CUDA) vs transformers.

``llmso bench suite gpu``, run by ``make bench-gpu`` through ``bench/gpu.sh`` (which builds
the two CUDA virtualenvs it needs: ``.venv-gpu`` for the gateway and the reference,
``.venv-vllm-cuda`` for vLLM; or, offline, takes an existing CUDA interpreter as
``--python``). The gateway serves the same folder the peers load (``--model-path``).
Unlike the CPU suite, vLLM keeps its CUDA graphs (no ``--enforce-eager``): the peer runs
as it would be deployed. Prefix caching is off on both sides (the prompts repeat across
levels); one more level, c = 64. A folder of random weights (``bench.random_weights``)
says so in the results' notes.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.machine import command_output, venv_package_version
from bench.random_weights import random_weights_note
from bench.spec import CompareSpec
from bench.suites import MODEL_NAME, hf_system, reference_system, vllm_system

GPU_VENV = ".venv-gpu"
VLLM_CUDA_VENV = ".venv-vllm-cuda"


def gpu_models_suite(
    root: Path,
    model_path: str,
    *,
    quick: bool = False,
    concurrency: tuple[int, ...] | None = None,
    dtype: str = "bfloat16",
    include_vllm: bool = True,
    hf_threads: int | None = None,
    python: Path | None = None,
) -> CompareSpec:
    """hf continuous on ``cuda``, vLLM from ``.venv-vllm-cuda``, transformers on ``cuda``;
    the gateway and the reference run on ``python`` (default: ``.venv-gpu``'s)."""
    python = python or root / GPU_VENV / "bin/python"
    levels = concurrency or ((1, 4) if quick else (1, 4, 16, 64))
    max_seqs = 64
    threads = hf_threads or min(8, len(os.sched_getaffinity(0)))
    systems = [
        hf_system(
            root,
            "llmso-hf-continuous-cuda",
            "continuous",
            dtype=dtype,
            max_seqs=max_seqs,
            threads=threads,
            prefix_caching=False,
            device="cuda",
            python=python,
            source=model_path,
        )
    ]
    vllm_venv = root / VLLM_CUDA_VENV
    if include_vllm:
        systems.append(
            vllm_system(
                vllm_venv,
                model_path,
                "vllm-cuda",
                dtype=dtype,
                max_seqs=max_seqs,
                prefix_caching=False,
                enforce_eager=False,
                # a 135M model: a small slice of the GPU is plenty of KV cache
                extra_args=("--gpu-memory-utilization", "0.3"),
            )
        )
    systems.append(
        reference_system(python, model_path, dtype=dtype, threads=threads, device="cuda")
    )
    vllm_version = venv_package_version(vllm_venv, "vllm")
    vllm_note = (
        f"vLLM: {vllm_version or 'not installed'} (CUDA graphs on), max_num_seqs 64, "
        "prefix caching off (both engines)"
        if include_vllm
        else "vLLM: not run (--no-vllm)"
    )
    weights_note = random_weights_note(model_path)
    return CompareSpec(
        title=(
            f"SmolLM2-135M-Instruct{' (random weights)' if weights_note else ''} on CUDA: "
            f"llmso hf continuous vs {'vLLM vs ' if include_vllm else ''}transformers"
        ),
        model=MODEL_NAME,
        max_tokens=8 if quick else 128,
        ignore_eos=True,
        concurrency=levels,
        min_requests=4 if quick else 16,
        requests_per_concurrency=1 if quick else 2,
        warmup=1 if quick else 4,
        timeout_s=120,
        level_duration_s=60,
        slo_ttft_ms=200,
        slo_itl_ms=20,
        notes=(
            f"model: {model_path} ({dtype}) on cuda, chat API, temperature 0, ignore_eos",
            *((weights_note,) if weights_note else ()),
            f"GPU: {_gpu_name() or 'unknown (nvidia-smi failed)'}",
            vllm_note,
            "transformers-generate is sequential in-process on cuda (concurrency 1 only)",
            "goodput: requests with TTFT <= 200 ms and mean inter-token gap <= 20 ms",
        ),
        systems=tuple(systems),
    )


def _gpu_name() -> str | None:
    """The first GPU's name, memory and driver as nvidia-smi reports them."""
    query = "--query-gpu=name,memory.total,driver_version"
    return command_output(["nvidia-smi", query, "--format=csv,noheader"])
