# The Helm chart: see docs/chart.md.
#   make chart-test          the chart's fast tests (lint, rendering, validation, promtool, checkov)
#   make chart-readme        regenerate the values table of charts/taskherd/README.md and the
#                            contract table of docs/chart.md
#   make chart-test-prereqs  what those tests need: the pinned helm, promtool, checkov's own venv
#   make chart-package       dist/charts/taskherd-<version>.tgz (`helm package`)
#   make chart-push CHART_REGISTRY=oci://registry.example/charts
#                            push that package to an OCI registry (after `helm registry login`)
.PHONY: helm-binary promtool checkov-venv chart-test-prereqs chart-test chart-readme chart-package chart-push

CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := $(TASKHERD_HOME)/venv-checkov

# helm is built from the Go module proxy at the version pinned in e2e/cluster/versions.env, into
# $(TASKHERD_HOME)/bin/helm-<version>/helm; build.sh is a no-op when it is already there.
helm-binary:
	bash e2e/cluster/build.sh helm

# promtool (`promtool test rules`) comes with Debian's prometheus package.
promtool:
	@$(STEPS) apt-install prometheus

# checkov pins dozens of libraries: it gets a venv of its own, never the project's .venv.
$(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION):
	@$(STEPS) run "checkov venv" checkov-venv -- bash -c 'set -e; \
	  test -x $(CHECKOV_VENV)/bin/python || python3 -m venv $(CHECKOV_VENV); \
	  $(CHECKOV_VENV)/bin/pip install --upgrade pip; \
	  $(CHECKOV_VENV)/bin/pip install "checkov==$(CHECKOV_VERSION)"'
	@touch $@

checkov-venv: $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)
	@$(STEPS) reused "checkov venv"

chart-test-prereqs: helm-binary promtool checkov-venv

TEST_PREREQS += chart-test-prereqs
# The chart tests are fast tests too: `make test-fast` gets the same prerequisites.
test-fast: chart-test-prereqs

chart-test: venv chart-test-prereqs
	$(VENV)/bin/pytest tests/chart -m 'not cluster' $(PYTEST_ARGS)

chart-readme: venv
	$(PY) charts/taskherd/hack/gen-readme.py
	$(PY) charts/taskherd/hack/gen-contract-table.py

# -- packaging ---------------------------------------------------------------------------------
HELM_VERSION := $(shell sed -n 's/^HELM_VERSION=//p' e2e/cluster/versions.env)
HELM := $(TASKHERD_HOME)/bin/helm-$(HELM_VERSION)/helm
CHART_VERSION := $(shell sed -n 's/^version: *//p' charts/taskherd/Chart.yaml)
CHART_DIST := dist/charts
CHART_PACKAGE := $(CHART_DIST)/taskherd-$(CHART_VERSION).tgz

# The version is Chart.yaml's: bump it there (and appVersion with the images) before a release.
chart-package: helm-binary
	@mkdir -p $(CHART_DIST)
	$(HELM) package charts/taskherd --destination $(CHART_DIST)
	@echo "packaged $(CHART_PACKAGE)"

# Helm >= 3.8 pushes charts to OCI registries; users install with
#   helm install taskherd $(CHART_REGISTRY)/taskherd --version $(CHART_VERSION)
chart-push: chart-package
	@test -n "$(CHART_REGISTRY)" || { echo "set CHART_REGISTRY=oci://<registry>/<path>"; exit 2; }
	$(HELM) push $(CHART_PACKAGE) $(CHART_REGISTRY)
