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

# $(call llamacpp_install,VENV,CMAKE_ARGS): llama-cpp-python[server] compiled into VENV.
define llamacpp_install
	@test -x $(1)/bin/python || $(PYTHON) -m venv $(1)
	nice -n 10 $(1)/bin/python -m pip install $(PIP_FLAGS) -q --upgrade pip
	CMAKE_ARGS="$(2)" nice -n 10 $(1)/bin/python -m pip install \
		$(PIP_FLAGS) --no-cache-dir "llama-cpp-python[server]==$(LLAMACPP_VERSION)"
	$(1)/bin/python -c "import llama_cpp.server" >/dev/null
	@touch $@
endef

$(LLAMACPP_VENV)/.stamp: mk/llamacpp.mk
	$(call llamacpp_install,$(LLAMACPP_VENV),$(LLAMACPP_CMAKE_ARGS))

# For benchmarks only (`make bench-quant-serve`): llama.cpp built for the CPU it runs on,
# as a user building it would (GGML_NATIVE=ON: ggml probes this CPU's ISA at build time).
# Not in ENGINES: on the Intel AMX box the native build crashed (above), so tests keep
# the pinned build.
LLAMACPP_NATIVE_VENV := .venv-llamacpp-native
.PHONY: llamacpp-native

llamacpp-native: $(LLAMACPP_NATIVE_VENV)/.stamp

$(LLAMACPP_NATIVE_VENV)/.stamp: mk/llamacpp.mk
	$(call llamacpp_install,$(LLAMACPP_NATIVE_VENV),-DGGML_NATIVE=ON)

# For benchmarks only (`make bench-quant-shapes`): llama.cpp's own HF -> GGUF converter
# (convert_hf_to_gguf.py, its conversion/ package and gguf-py), taken from the same
# llama-cpp-python source release as the server so file and runtime agree, in a venv of
# its own (it needs sentencepiece, which the product does not). torch and transformers
# are the product's pins.
GGUF_CONVERT_VENV := .venv-gguf-convert
GGUF_CONVERT_PINS = $(shell grep -E '^(torch|transformers|numpy)[=<]' requirements.txt) \
	sentencepiece==0.2.3 protobuf==7.36.2 safetensors==0.8.0 PyYAML==6.0.4
LLAMACPP_SDIST := llama_cpp_python-$(LLAMACPP_VERSION)
.PHONY: gguf-convert

gguf-convert: $(GGUF_CONVERT_VENV)/.stamp

$(GGUF_CONVERT_VENV)/.stamp: mk/llamacpp.mk requirements.txt
	@test -x $(GGUF_CONVERT_VENV)/bin/python || $(PYTHON) -m venv $(GGUF_CONVERT_VENV)
	nice -n 10 $(GGUF_CONVERT_VENV)/bin/python -m pip install $(PIP_FLAGS) -q \
		$(patsubst %,'%',$(GGUF_CONVERT_PINS))
	rm -rf $(GGUF_CONVERT_VENV)/src && mkdir -p $(GGUF_CONVERT_VENV)/src
	$(GGUF_CONVERT_VENV)/bin/python -m pip download $(PIP_FLAGS) -q --no-deps \
		--no-binary :all: -d $(GGUF_CONVERT_VENV)/src "llama-cpp-python==$(LLAMACPP_VERSION)"
	tar xzf $(GGUF_CONVERT_VENV)/src/$(LLAMACPP_SDIST).tar.gz -C $(GGUF_CONVERT_VENV)/src \
		--strip-components=3 $(addprefix $(LLAMACPP_SDIST)/vendor/llama.cpp/,\
		convert_hf_to_gguf.py conversion gguf-py)
	rm $(GGUF_CONVERT_VENV)/src/$(LLAMACPP_SDIST).tar.gz
	$(GGUF_CONVERT_VENV)/bin/python $(GGUF_CONVERT_VENV)/src/convert_hf_to_gguf.py --help >/dev/null
	@touch $@

# For benchmarks only (`make bench-c1`): llama.cpp's own HTTP server (tools/server, the
# `llama-server` binary), compiled from the same llama-cpp-python source release as the
# venvs above, for the CPU it runs on, as one static binary under $(LLAMA_SERVER_DIR)/bin;
# the sources and the build tree are removed once it is built. GGML_NATIVE, except on a
# CPU with AMX: there (an Intel Xeon with AMX, 2026-12-04) the native build segfaulted
# while loading the SmolLM2 Q4_1 GGUF (ggml's AMX weight buffers; `--no-repack` avoided
# it), so it is built for the same ISA without AMX (AVX512 with VNNI, BF16 and VBMI, which
# every AMX CPU has); that build serves. LLAMA_SERVER_CMAKE_ARGS overrides the choice.
LLAMA_SERVER_DIR ?= .engines/llama-server
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/bin/llama-server
LLAMA_SERVER_NO_AMX_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
	-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON \
	-DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
LLAMA_SERVER_CMAKE_ARGS ?= $(if $(shell grep -qw amx_tile /proc/cpuinfo 2>/dev/null && echo y),\
	$(LLAMA_SERVER_NO_AMX_ARGS),-DGGML_NATIVE=ON)
LLAMA_SERVER_JOBS ?= 2
.PHONY: llama-server

llama-server: $(LLAMA_SERVER_DIR)/.stamp

$(LLAMA_SERVER_DIR)/.stamp: mk/llamacpp.mk | $(VENV)/.stamp-runtime
	rm -rf $(LLAMA_SERVER_DIR)/src $(LLAMA_SERVER_DIR)/build && mkdir -p $(LLAMA_SERVER_DIR)/src
	$(PIP) download $(PIP_FLAGS) -q --no-deps --no-binary :all: -d $(LLAMA_SERVER_DIR)/src \
		"llama-cpp-python==$(LLAMACPP_VERSION)"
	tar xzf $(LLAMA_SERVER_DIR)/src/$(LLAMACPP_SDIST).tar.gz -C $(LLAMA_SERVER_DIR)/src \
		--strip-components=3 $(LLAMACPP_SDIST)/vendor/llama.cpp
	nice -n 10 cmake -S $(LLAMA_SERVER_DIR)/src -B $(LLAMA_SERVER_DIR)/build -DCMAKE_BUILD_TYPE=Release \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		$(LLAMA_SERVER_CMAKE_ARGS) >/dev/null
	nice -n 10 cmake --build $(LLAMA_SERVER_DIR)/build --target llama-server -j $(LLAMA_SERVER_JOBS)
	mkdir -p $(LLAMA_SERVER_DIR)/bin
	cp $(LLAMA_SERVER_DIR)/build/bin/llama-server $(LLAMA_SERVER)
	rm -rf $(LLAMA_SERVER_DIR)/src $(LLAMA_SERVER_DIR)/build
	$(LLAMA_SERVER) --version
	@touch $@
