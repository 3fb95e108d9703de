# Triton Inference Server on CPU, from the nvidia-pytriton wheel (it ships tritonserver 2.51
# with the Python backend and one stub per Python version), plus the virtualenv the
# Python-backend models run in. The stub embeds libpython and is built against numpy 1.x,
# so the model environment pins numpy<2 and lives apart from .venv.
#   .engines/triton/wheel/pytriton/tritonserver   bin/, backends/python/ (+ stub), caches/
#   .venv-triton-model                            torch CPU, transformers, numpy<2, xgrammar
# deploy/triton/run.sh starts the server with the right LD_LIBRARY_PATH and PYTHONPATH.

TRITON_DIR := .engines/triton
TRITON_VENV := .venv-triton-model
TRITON_PYTRITON ?= nvidia-pytriton==0.7.0

.PHONY: triton
ENGINES += triton

triton: $(TRITON_DIR)/.stamp $(TRITON_VENV)/.stamp

$(TRITON_DIR)/.stamp: mk/triton.mk | $(VENV)/.stamp
	rm -rf $(TRITON_DIR) && mkdir -p $(TRITON_DIR)/dl
	$(PIP) download $(PIP_FLAGS) -q --no-deps -d $(TRITON_DIR)/dl '$(TRITON_PYTRITON)'
	$(PY) -m zipfile -e $(TRITON_DIR)/dl/nvidia_pytriton-*.whl $(TRITON_DIR)/wheel
	rm -rf $(TRITON_DIR)/dl
	@# zipfile drops the execute bits; the libraries find each other by relative RPATHs.
	chmod +x $(TRITON_DIR)/wheel/pytriton/tritonserver/bin/tritonserver
	v=$$($(PYTHON) -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') && \
	  cp $(TRITON_DIR)/wheel/pytriton/tritonserver/python_backend_stubs/$$v/triton_python_backend_stub \
	     $(TRITON_DIR)/wheel/pytriton/tritonserver/backends/python/
	chmod +x $(TRITON_DIR)/wheel/pytriton/tritonserver/backends/python/triton_python_backend_stub
	@touch $@

$(TRITON_VENV)/.stamp: mk/triton.mk
	@test -x $(TRITON_VENV)/bin/python || $(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install $(PIP_FLAGS) -q \
	  'torch==2.13.0+cpu' 'transformers==5.19.0' 'numpy<2' 'apache-tvm-ffi==0.1.15.post2'
	@# xgrammar without its `triton` (GPU compiler) dependency; see requirements-nodeps.txt.
	$(TRITON_VENV)/bin/python -m pip install $(PIP_FLAGS) -q --no-deps 'xgrammar==0.2.9'
	@touch $@
