# Prometheus and promtool (Debian package `prometheus`) for the monitoring tests:
# tests/deploy/test_prometheus.py starts a real Prometheus on a free port against a live
# gateway, and runs `promtool check config|rules` on deploy/prometheus.
# Reused when present; apt-get update runs only when the package is not known yet.
PROM_SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

ENGINES += prometheus
.PHONY: prometheus

prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  $(PROM_SUDO) apt-get install -y -q prometheus || \
	  { $(PROM_SUDO) apt-get update -q && $(PROM_SUDO) apt-get install -y -q prometheus; }; }
	@promtool --version | head -1
