# The batch drill (docs/batch.md): a 500-line batch surviving a kill -9 of the gateway
# midway, then the online-TTFT measurement (4 streams of 64 tokens with and without a
# 500-request batch beside them; the batch's progress beside them vs on an idle gateway).
# Not part of `make test` (which runs a 12-line kill in tests/e2e/test_batch_hf.py).
# Run it on a quiet machine.
#   BATCH_DRILL_ARGS="--lines 100 --window 30"  a shorter run
BATCH_DRILL_ARGS ?=
BATCH_DRILL_OUT ?= docs/benchmarks/batch/drill.json

.PHONY: batch-drill

batch-drill: setup
	$(PY) -m tests.drills.batch_drill $(BATCH_DRILL_ARGS) --json $(BATCH_DRILL_OUT)
