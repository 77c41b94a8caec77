# The Helm chart (issue 6): see docs/chart.md.
#   make chart-test          the chart's fast tests (lint, rendering, validation, promtool, checkov)
#   make chart-readme        regenerate the values table of charts/taskherd/README.md and the
#                            contract table of docs/chart.md
#   make chart-test-prereqs  what those tests need: the pinned helm, promtool, checkov's own venv
.PHONY: helm-binary promtool checkov-venv chart-test-prereqs chart-test chart-readme

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
