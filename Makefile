# taskherd — the two commands a newcomer needs:
#   make demo   the main job: a real cluster, workers surviving chaos, the verdict
#   make test   every test, with the services it needs installed and started here
SHELL := /bin/bash
.DEFAULT_GOAL := help

# Caches and service state live outside the checkout so every clone (and CI) on this machine
# reuses the expensive parts (Kubernetes binaries, images, wheels).
export TASKHERD_HOME ?= $(HOME)/.cache/taskherd
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# Each area owns one fragment: mk/cluster.mk, mk/demo.mk, mk/bench.mk … Included before the
# rules below so that the fragments can add to TEST_PREREQS.
include $(wildcard mk/*.mk)

.PHONY: help venv services services-down test test-fast bench clean

help:
	@echo "make demo        run the demo on a real cluster (see README.md)"
	@echo "make test        install and start what the tests need, then run them all"
	@echo "make test-fast   tests that need no cluster"
	@echo "make services    install and start Redis, RabbitMQ, PostgreSQL on loopback"
	@echo "make bench       benchmarks (figures beside their baselines)"

# The virtualenv is rebuilt when a pyproject.toml changes: the two distributions (worker/ and
# operator/, editable) and the workspace's test and demo tools.
$(VENV)/.installed: pyproject.toml worker/pyproject.toml operator/pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ./worker -e ./operator -e '.[test,demo]'
	touch $@

venv: $(VENV)/.installed

services:
	bash scripts/services.sh up

services-down:
	bash scripts/services.sh down

# Cluster tests run when the cluster can be brought up (mk/cluster.mk adds that step).
test: venv services $(TEST_PREREQS)
	source scripts/services.sh env && $(VENV)/bin/pytest $(PYTEST_ARGS)

test-fast: venv services
	source scripts/services.sh env && $(VENV)/bin/pytest -m 'not cluster' $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
