# The chaos suite: see docs/chaos.md.
#   make chaos               every fault of e2e/chaos/faults on Redis and RabbitMQ, on the cluster the e2e
#                            entry point resolves (E2E_CLUSTER=kind for the node faults); about 35 min here (kind: about 50)
#   make chaos CHAOS_FAULTS="broker-restart oom-kill" CHAOS_BROKER=redis    a part of it
#   make chaos CHAOS_UPDATE_DOCS=1   also write the matrix into docs/chaos.md (do it for a full run)
#   make chaos-soak          random faults against a continuous load: >= 10,000 tasks, >= 50 faults
#                            (CHAOS_BROKER=redis|rabbitmq, CHAOS_SOAK_TASKS, CHAOS_SOAK_FAULTS, CHAOS_SOAK_RATE)
#   make chaos-down          remove the chaos services and any namespace a chaos run left
# `make test` runs the short subset (faults marked `subset: true`, one broker): tests/chaos.
# Each run writes runs/chaos-<time>/: the matrix (matrix.md) and per scenario summary.json and timeline.png.
.PHONY: chaos chaos-run chaos-soak chaos-soak-run chaos-down
CHAOS_BROKER ?= all
CHAOS_FAULTS ?=
CHAOS_UPDATE_DOCS ?=
CHAOS_SOAK_TASKS ?= 10000
CHAOS_SOAK_FAULTS ?= 50
CHAOS_SOAK_RATE ?= 5

chaos:
	@$(STEPS) with-summary "make chaos" -- $(MAKE) --no-print-directory chaos-run

chaos-run: venv cluster-for-tests
	@$(STEPS) time chaos -- $(PY) -m e2e.chaos run --broker $(CHAOS_BROKER) \
	  $(foreach f,$(CHAOS_FAULTS),--fault $(f)) $(if $(CHAOS_UPDATE_DOCS),--update-docs)

chaos-soak:
	@$(STEPS) with-summary "make chaos-soak" -- $(MAKE) --no-print-directory chaos-soak-run

chaos-soak-run: venv cluster-for-tests
	@$(STEPS) time chaos-soak -- $(PY) -m e2e.chaos soak \
	  --broker $(if $(filter all,$(CHAOS_BROKER)),redis,$(CHAOS_BROKER)) \
	  --tasks $(CHAOS_SOAK_TASKS) --faults $(CHAOS_SOAK_FAULTS) --rate $(CHAOS_SOAK_RATE)

chaos-down: venv
	$(PY) -m e2e.chaos down
