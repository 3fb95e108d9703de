"""The shared-prefix suite: one ~1,000-token instruction block, short distinct questions.

Three systems on the same prompts (``bench.prompts.shared_prefix_prompts``): the hf
continuous engine with its prefix cache on, the same engine with it off (the ratio of
their TTFTs is what the cache buys, measured in one run), and vLLM-CPU with its prefix
caching on. This is the only suite where vLLM's prefix caching is enabled.
"""

from __future__ import annotations

import os
from pathlib import Path

from bench.kv_memory import kv_notes
from bench.machine import venv_package_version
from bench.spec import CompareSpec
from bench.suites import MODEL_NAME, hf_system, vllm_system


def prefix_suite(
    root: Path,
    model_path: str,
    *,
    quick: bool = False,
    concurrency: tuple[int, ...] | None = None,
    dtype: str = "bfloat16",
    include_vllm: bool = True,
    hf_threads: int | None = None,
) -> CompareSpec:
    """hf continuous with and without the prefix cache, and vLLM-CPU with its own on."""
    levels = concurrency or ((1, 2) if quick else (1, 4, 16))
    max_seqs = 64
    threads = hf_threads or len(os.sched_getaffinity(0))
    systems = [
        hf_system(
            root,
            label,
            "continuous",
            dtype=dtype,
            max_seqs=max_seqs,
            threads=threads,
            prefix_caching=caching,
        )
        for label, caching in (("llmso-hf-prefix-cache", True), ("llmso-hf-no-prefix-cache", False))
    ]
    vllm_venv = root / ".venv-vllm"
    if include_vllm:
        systems.append(
            vllm_system(
                vllm_venv,
                model_path,
                "vllm-cpu-prefix-cache",
                dtype=dtype,
                max_seqs=max_seqs,
                prefix_caching=True,
                env={"VLLM_CPU_KVCACHE_SPACE": "2"},
            )
        )
    vllm_version = venv_package_version(vllm_venv, "vllm", "vllm_cpu")
    return CompareSpec(
        title="Shared ~1,000-token prefix: llmso hf with/without prefix cache vs vLLM-CPU",
        model=MODEL_NAME,
        workload="shared-prefix",
        max_tokens=8 if quick else 32,
        ignore_eos=True,
        concurrency=levels,
        min_requests=4 if quick else 8,
        requests_per_concurrency=1 if quick else 2,
        warmup=1 if quick else 2,
        timeout_s=300,
        level_duration_s=90,
        slo_ttft_ms=1000,
        slo_itl_ms=100,
        notes=(
            f"model: {model_path} ({dtype}), chat API, temperature 0, ignore_eos",
            "prompts: the same 1,008-token instruction block (one user message) followed by a "
            "question unique to each request; warm-up requests fill the caches",
            f"vLLM: {vllm_version or 'not installed'}, --enforce-eager, --enable-prefix-caching, "
            "VLLM_CPU_KVCACHE_SPACE=2, max_num_seqs 64",
            "llmso: hf continuous, prefix_cache_tokens 8192 (16-token blocks), on vs off; "
            "max_num_seqs 64 (not the shipped 32), max_queue 1024 (the config in results.json)",
            f"torch intra-op threads: {threads}",
            *kv_notes(model_path, dtype, vllm_space_gib=2, prefix_tokens=8192),
        ),
        systems=tuple(systems),
    )
