# llama.cpp's OpenAI-compatible server (llama-cpp-python[server]) in .venv-llamacpp.
# Compiled from source (~5 min on 2 cores). The default GGML_NATIVE build picks ggml's
# AMX path on these CPUs and crashes on the first inference, so we pin the ISA level.
LLAMACPP_VENV := .venv-llamacpp
LLAMACPP_VERSION ?= 0.3.36
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_AVX512=ON \
	-DGGML_FMA=ON -DGGML_F16C=ON

ENGINES += llamacpp
.PHONY: llamacpp

llamacpp: $(LLAMACPP_VENV)/.stamp

$(LLAMACPP_VENV)/.stamp: mk/llamacpp.mk
	@test -x $(LLAMACPP_VENV)/bin/python || $(PYTHON) -m venv $(LLAMACPP_VENV)
	nice -n 10 $(LLAMACPP_VENV)/bin/python -m pip install $(PIP_FLAGS) -q --upgrade pip
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" nice -n 10 $(LLAMACPP_VENV)/bin/python -m pip install \
		$(PIP_FLAGS) --no-cache-dir "llama-cpp-python[server]==$(LLAMACPP_VERSION)"
	$(LLAMACPP_VENV)/bin/python -c "import llama_cpp.server" >/dev/null
	@touch $@
