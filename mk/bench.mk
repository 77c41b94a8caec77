# Benchmarks: each prints its figures beside its baseline from the same run (vanilla Celery,
# `celery inspect ping`, kombu's own redelivery, KEDA + HPA, KEDA's own queue queries). Not part of
# `make test`: they take minutes and the machine is noisy; docs/benchmarks.md carries the latest
# figures. `make bench` runs them all in this order (scaleup before autoscaling, which replays the
# pod start times scaleup measured); `make bench-<name>` runs one.
BENCHES := worker_boot throughput instructions throughput_grid profile_cost probe_cost guard_cost redelivery recovery_overhead inspection_cost \
           operator_reaction operator_scale scaleup pod_kill autoscaling

.PHONY: bench $(addprefix bench-,$(BENCHES))

bench: $(addprefix bench-,$(BENCHES))

$(addprefix bench-,$(BENCHES)): bench-%: venv services
	source scripts/services.sh env && $(PY) bench/$*.py

# worker_boot renders the chart's worker container with the pinned helm.
bench-worker_boot: helm-binary

# The cluster benchmarks need the cluster and the images (as the cluster tests do).
bench-scaleup bench-pod_kill: cluster-for-tests

# bench/instructions.py counts with cachegrind: valgrind, installed (and recorded) on first use.
bench-instructions: valgrind-package
.PHONY: valgrind-package
valgrind-package:
	@bash -c 'source scripts/lib.sh && apt_install valgrind'
