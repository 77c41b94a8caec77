# The demo: see docs/demo.md.
#   make demo                 the full demo on a real cluster; BROKER=redis|rabbitmq (default rabbitmq)
#   make demo DEMO_SHORT=1    the short version (fewer charges and faults), as `make test` runs it
#   make demo-down            remove what the demo created (not the cluster, not the services)
# The driver picks the cluster (kubeconfig, kind, else `make cluster`), starts the services, builds
# the images when their sources changed, installs the chart and narrates; see e2e/demo/.
# The table of setup steps (scripts/steps.sh) follows the demo's verdict.
.PHONY: demo demo-run demo-down
BROKER ?= rabbitmq

demo:
	@$(STEPS) with-summary "make demo" -- $(MAKE) --no-print-directory demo-run

demo-run: venv
	@$(STEPS) time demo -- $(PY) -m e2e.demo run --broker $(BROKER)

demo-down: venv
	$(PY) -m e2e.demo down
