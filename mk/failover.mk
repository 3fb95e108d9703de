# The mid-stream failover drill (docs/replicas.md, Mid-stream failover): two llama.cpp
# replicas, greedy chat requests of 200 tokens, the serving replica SIGKILLed at a random
# point of each stream (50 trials), then a relay garbling one replica's stream (10).
# Not part of `make test` (which runs 3 + 1 in tests/e2e/test_failover_llamacpp.py).
#   FAILOVER_ARGS="--trials 10 --garbage 2"  a shorter run
FAILOVER_ARGS ?= --trials 50 --garbage 10 --min-identical 45
FAILOVER_OUT ?= docs/benchmarks/failover/trials.json

.PHONY: failover-trials failover-seams

failover-trials: setup llamacpp
	$(PY) -m tests.drills.failover_drill $(FAILOVER_ARGS) --json $(FAILOVER_OUT)

# A garbage trial at every cut where the delivered text tokenises into other ids than the
# engine generated (the seams a continuation from text alone gets wrong).
failover-seams: setup llamacpp
	$(PY) -m tests.drills.failover_drill --trials 0 --garbage 0 --seams -1 \
		--json docs/benchmarks/failover/seams.json
