# The soak (tests/drills/soak.py): mixed load through two gateways sharing Redis while a
# chaos loop kills/restarts replicas, restarts Redis, edits the config + SIGHUP, and
# clients drop streams. Not part of `make test`.
#   make soak                                   60 minutes, report in docs/soak/
#   make soak SOAK_DURATION=150 SOAK_REPORT=/tmp/soak.md   a short run
SOAK_DURATION ?= 3600
SOAK_REPORT ?= docs/soak/report-60min.md
SOAK_ARGS ?=

.PHONY: soak

soak: setup redis
	$(PY) -m tests.drills.soak --duration $(SOAK_DURATION) --report $(SOAK_REPORT) $(SOAK_ARGS)
