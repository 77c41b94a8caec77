"""The `make demo` driver: a real cluster, the sample shop app, faults, and a verdict.

Run from the repository root: `.venv/bin/python -m e2e.demo [--short] [--broker redis|rabbitmq]`,
`.venv/bin/python -m e2e.demo down`. The deciding parts (`verdict`, `timeline`) are pure and
unit-tested; the rest is a thin shell around kubectl, helm and the services.
"""
