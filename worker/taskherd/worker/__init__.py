"""taskherd.worker — what runs inside a user's Celery worker.

The reliability profile, retries, dead-lettering, the delivery counter, idempotency, the outbox,
the heartbeat, the drain and metrics. Each concern is one module; `configure(app)` wires them.
"""
