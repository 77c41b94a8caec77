"""The payments service's Celery app.

It was an ordinary Celery app; putting it under taskherd added the `configure()` call below and
nothing else here. The broker URL comes from the environment: the chart passes
`TASKHERD_BROKER_URL` from the Secret named in its `broker.existingSecret`, and configure() reads it.
"""
from celery import Celery

from taskherd.worker import configure

app = Celery("payments", include=["payments.tasks"])
app.conf.update(
    task_default_queue="payments",
    task_ignore_result=True,  # effects live in PostgreSQL; nobody waits on a result backend
    broker_connection_retry_on_startup=True,
)

configure(
    app,
    queues=["payments"],
    # A capture takes a few seconds at the card network; nothing may hold a worker past 30 s.
    # (In the cluster the chart's timeLimits win: it derives the pods' grace period from them.)
    soft_time_limit=20,
    time_limit=30,
    # A message that kills its worker (the settlement batch, OOM) three times is dead-lettered.
    max_deliveries=3,
)
