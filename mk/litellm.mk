# LiteLLM's proxy in its own virtualenv (.venv-litellm): a peer in the gateway overhead
# benchmark (`make bench-overhead`), measured against the same fake upstream as llmso.
# Not an engine: not in ENGINES, not part of `make test`. Pinned: later releases are
# marked compromised/yanked on PyPI.
LITELLM_VENV := .venv-litellm
LITELLM_VERSION ?= 1.108.7

.PHONY: litellm

litellm: $(LITELLM_VENV)/.stamp

$(LITELLM_VENV)/.stamp: mk/litellm.mk
	@test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	nice -n 10 $(LITELLM_VENV)/bin/python -m pip install $(PIP_FLAGS) -q --upgrade pip
	nice -n 10 $(LITELLM_VENV)/bin/python -m pip install $(PIP_FLAGS) -q \
		"litellm[proxy]==$(LITELLM_VERSION)"
	LITELLM_LOCAL_MODEL_COST_MAP=True $(LITELLM_VENV)/bin/python -c "import litellm.proxy.proxy_server" >/dev/null
	@touch $@
