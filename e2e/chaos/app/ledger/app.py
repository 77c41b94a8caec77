"""The ledger's Celery app: everything taskherd needs is the `configure(app, ...)` call.

Producers (the chaos driver on the host, the outbox relay) build the same app with `make_app` so
that the work queue is declared with the dead-letter arguments the workers use.
"""
from __future__ import annotations

from celery import Celery

import taskherd.worker

QUEUE = "ledger"
DEAD_LETTER_QUEUE = "ledger.dlq"
TASK = "ledger.apply"
#: hard time limit of a task; the chart values (e2e/chaos/app/values.yaml) say the same
TIME_LIMIT_SECONDS = 30
SOFT_TIME_LIMIT_SECONDS = 20
#: deliveries that kill their worker before the message is dead-lettered unrun (the OOM poison)
MAX_DELIVERIES = 4


def make_app(*, broker_url: str, queue_type: str = "classic", delivery_counter_url: str | None = None) -> Celery:
    app = Celery("ledger", broker=broker_url)
    app.conf.update(
        task_default_queue=QUEUE,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,  # the ledger is in PostgreSQL and Redis; nobody waits on a result
    )
    taskherd.worker.configure(
        app,
        queues=[QUEUE],
        queue_type=queue_type,
        soft_time_limit=SOFT_TIME_LIMIT_SECONDS,
        time_limit=TIME_LIMIT_SECONDS,
        # Faults last up to two minutes (a partition, a database restart): a transient failure is
        # retried for longer than that before it counts as exhausted.
        max_retries=24,
        backoff_base=0.5,
        backoff_cap=8,
        max_deliveries=MAX_DELIVERIES,
        delivery_counter_url=delivery_counter_url,
    )
    return app
