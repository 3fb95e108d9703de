# redis-server (Debian package) for the shared rate-limit store's end-to-end tests
# (tests/e2e/test_frontdoor_redis.py starts its own instance on a free port).
# Reused when present; apt-get update runs only when the package is not known yet.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

ENGINES += redis
.PHONY: redis

redis:
	@command -v redis-server >/dev/null || { \
	  $(SUDO) apt-get install -y -q redis-server || \
	  { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q redis-server; }; }
	@redis-server --version
