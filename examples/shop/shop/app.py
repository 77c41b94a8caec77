"""The Celery app. Everything taskherd needs is the `configure(app, ...)` call below.

Configuration comes from the environment, as the Helm chart sets it:

- `TASKHERD_BROKER_URL`  broker URL (the chart reads it from a Secret)
- `SHOP_DATABASE_URL`    PostgreSQL DSN of the shop's database (from a Secret too)
- `TASKHERD_DELIVERY_COUNTER_URL`  RabbitMQ only: a Redis URL where deliveries are counted, so a
  message that kills its worker every time is dead-lettered (optional)
- `TASKHERD_SOFT_TIME_LIMIT`, `TASKHERD_TIME_LIMIT`, `TASKHERD_QUEUES`, … : the chart <-> worker
  contract. configure() reads them itself and they win over the values written below, so the pod's
  grace period and the worker's limits come from the same chart values (docs/chart.md).

configure() also starts taskherd's runtime pieces in the worker: the heartbeat the probes read, the
preStop drain, the metrics the operator reads to remove idle workers first, fast recovery of a
killed worker's messages on Redis, and the publish-time stamp that makes queue age measurable.
"""
from __future__ import annotations

import os

from celery import Celery

import taskherd.worker

QUEUE = os.environ.get("SHOP_QUEUE", "shop")


def make_app(*, broker_url: str, queue: str = QUEUE) -> Celery:
    """The shop's Celery app on `broker_url`. Producers use it too: it declares the queue with the
    same dead-letter arguments the workers do. (A TASKHERD_BROKER_URL in the environment wins.)"""
    app = Celery("shop", broker=broker_url, include=["shop.tasks", "shop.db"])
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,  # effects live in PostgreSQL; nobody waits on a result backend
    )
    taskherd.worker.configure(
        app,
        queues=[queue],
        # a charge takes seconds; nothing may hold a worker longer than 30 s
        soft_time_limit=20,
        time_limit=30,
        # A charge waits on a flaky gateway: retry transient failures quickly, a handful of times.
        max_retries=6,
        backoff_base=0.5,
        backoff_cap=8,
        # A report that kills its worker (OOM) three times is dead-lettered on its next delivery, unrun.
        max_deliveries=3,
        # Redis counts deliveries per task; on RabbitMQ point this at a Redis (or use quorum queues,
        # whose x-delivery-limit is the broker-side backstop). Empty: the broker's Redis, if any.
        delivery_counter_url=os.environ.get("TASKHERD_DELIVERY_COUNTER_URL") or None,
    )
    return app


def _broker_url() -> str:
    url = os.environ.get("TASKHERD_BROKER_URL", "")
    if not url:
        raise RuntimeError("TASKHERD_BROKER_URL is not set: the broker URL (redis://… or amqp://…), "
                           "which the chart reads from the Secret named in broker.existingSecret")
    return url


app = make_app(broker_url=_broker_url())
