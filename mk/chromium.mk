# Debian's Chromium for the console's browser tests (Playwright drives it through its
# executable path; Playwright never downloads a browser of its own). Idempotent: apt-get
# runs only when /usr/bin/chromium is missing, and `apt-get update` only when the package
# list does not know the package yet.
CHROMIUM := /usr/bin/chromium

ENGINES += chromium
.PHONY: chromium

chromium: $(CHROMIUM)

$(CHROMIUM):
	@if ! apt-cache show chromium >/dev/null 2>&1; then apt-get update -q; fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium
	@$(CHROMIUM) --version
