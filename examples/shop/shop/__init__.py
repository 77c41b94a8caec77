"""shop: a small Celery app using taskherd — copy it as the starting point of your own.

- `shop.app`      the Celery app and the one `taskherd.worker.configure(app)` call
- `shop.tasks`    the tasks: an idempotent charge, a report that can outgrow its memory limit
- `shop.gateway`  a flaky payment gateway (transient errors, retried with backoff)
- `shop.db`       the PostgreSQL tables, and the attempts ledger the demo's verdict reads
"""
