# taskherd — the two commands a newcomer needs:
#   make demo   the main job: a real cluster, workers surviving chaos, the verdict
#   make test   every test, with the services it needs installed and started here
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Caches and service state live outside the checkout so every clone (and CI) on this machine
# reuses the expensive parts (Kubernetes binaries, images, wheels).
export TASKHERD_HOME ?= $(HOME)/.cache/taskherd
# One record of setup steps per top-level make (sub-makes, such as the demo's `make cluster`,
# inherit it): scripts/lib.sh appends each step, built or reused, with its duration, and `make test`,
# `make demo`, `make cluster` and `make images` end with the table (scripts/steps.sh with-summary).
ifndef TASKHERD_STEPS_FILE
export TASKHERD_STEPS_FILE := $(TASKHERD_HOME)/steps/$(shell date -u +%Y%m%dT%H%M%SZ)-$(firstword $(MAKECMDGOALS) $(.DEFAULT_GOAL))-$(shell echo $$PPID).tsv
endif
STEPS := bash scripts/steps.sh
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# Each area owns one fragment: mk/cluster.mk, mk/demo.mk, mk/bench.mk … Included before the
# rules below so that the fragments can add to TEST_PREREQS.
include $(wildcard mk/*.mk)

.PHONY: help venv services services-down test test-run test-fast bench clean shellcheck

help:
	@echo "make demo        run the demo on a real cluster (see README.md)"
	@echo "make test        install and start what the tests need, then run them all"
	@echo "make test-fast   tests that need no cluster"
	@echo "make services    install and start Redis, RabbitMQ, PostgreSQL on loopback"
	@echo "make bench       benchmarks (figures beside their baselines)"
	@echo "make fresh-test  rehearse a first run on this machine (stops the services and the cluster; see README.md)"

# The virtualenv is rebuilt when a pyproject.toml changes: the two distributions (worker/ and
# operator/, editable) and the workspace's test and demo tools.
$(VENV)/.installed: pyproject.toml worker/pyproject.toml operator/pyproject.toml
	@$(STEPS) run venv venv -- bash -c 'set -e; test -x $(PY) || python3 -m venv $(VENV); \
	  $(PY) -m pip install --upgrade pip; \
	  $(PY) -m pip install -e ./worker -e ./operator -e ".[test,demo]"'
	@touch $@

venv: $(VENV)/.installed
	@$(STEPS) reused venv

services:
	bash scripts/services.sh up

services-down:
	bash scripts/services.sh down

# Cluster tests run when the cluster can be brought up (mk/cluster.mk adds that step). The table
# of setup steps follows the tests, whatever failed; the recipe exits with pytest's status (or that
# of the step that stopped the run), which make reports as "Error N" before exiting 2 as usual.
test:
	@$(STEPS) with-summary "make test" -- $(MAKE) --no-print-directory test-run

test-run: venv services $(TEST_PREREQS)
	@source scripts/services.sh env && $(STEPS) time tests --tee -- \
	  $(PY) scripts/run_tests.py $$([ -t 1 ] && echo --color=yes) $(PYTEST_ARGS)

test-fast: venv services
	source scripts/services.sh env && $(VENV)/bin/pytest -m 'not cluster' $(PYTEST_ARGS)

# Every shell script of the project, through Debian's shellcheck.
shellcheck:
	@$(STEPS) apt-install shellcheck
	shellcheck -x $$(git ls-files '*.sh' .ci/run)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
