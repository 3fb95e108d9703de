# mlx-lm's OpenAI-compatible server (mlx_lm.server) in .venv-mlx. On Linux `mlx[cpu]`
# gives the CPU build; on a Mac plain `mlx` uses Metal.
MLX_VENV := .venv-mlx
MLX_VERSION ?= 0.32.4
MLX_LM_VERSION ?= 0.32.2

ENGINES += mlx
.PHONY: mlx

mlx: $(MLX_VENV)/.stamp

$(MLX_VENV)/.stamp: mk/mlx.mk
	@test -x $(MLX_VENV)/bin/python || $(PYTHON) -m venv $(MLX_VENV)
	nice -n 10 $(MLX_VENV)/bin/python -m pip install $(PIP_FLAGS) -q --upgrade pip
	nice -n 10 $(MLX_VENV)/bin/python -m pip install $(PIP_FLAGS) \
		"mlx[cpu]==$(MLX_VERSION)" "mlx-lm==$(MLX_LM_VERSION)"
	$(MLX_VENV)/bin/python -c "import mlx_lm.server" >/dev/null
	@touch $@
