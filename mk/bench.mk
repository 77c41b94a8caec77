# Benchmarks: each prints its figures beside its baseline (vanilla Celery, `celery inspect ping`,
# kombu's own redelivery, KEDA's defaults). Not part of `make test`: they take minutes and the
# machine is noisy; docs/benchmarks.md and each area's doc carry the latest figures.
BENCHES := throughput probe_cost redelivery recovery_overhead operator_reaction operator_scale

.PHONY: bench $(addprefix bench-,$(BENCHES))

bench: $(addprefix bench-,$(BENCHES))

$(addprefix bench-,$(BENCHES)): bench-%: venv services
	source scripts/services.sh env && $(PY) bench/$*.py
