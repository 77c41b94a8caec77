"""ledger: the chaos suite's workload, a Celery app on taskherd whose every effect can be counted.

Each task applies one entry, named by its key, exactly once — guarded by one of taskherd's two
idempotency stores — and leaves a trail the checker reads after a fault:

- `ledger.app`     make_app(): the Celery app and its `taskherd.worker.configure(...)` call
- `ledger.worker`  the app the workers and the outbox relay load (broker URL from the environment)
- `ledger.tasks`   `ledger.apply`: work for a while, then the effect; poison kinds that always fail
- `ledger.db`      PostgreSQL: effects (UNIQUE key), duplicate applications, every attempt

The pods get this package as a ConfigMap mounted at /app/ledger (PYTHONPATH=/app); the chaos
driver imports `ledger.app` and `ledger.db` on the host to publish and to read the ledger.
"""
