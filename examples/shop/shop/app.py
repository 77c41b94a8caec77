"""The Celery app. Everything taskherd needs is the `configure(app, ...)` call below.

Configuration comes from the environment, as the Helm chart sets it:

- `TASKHERD_BROKER_URL`  broker URL (the chart reads it from a Secret)
- `SHOP_DATABASE_URL`    PostgreSQL DSN of the shop's database (from a Secret too)
- `TASKHERD_DELIVERY_COUNTER_URL`  RabbitMQ only: a Redis URL where deliveries are counted, so a
  message that kills its worker every time is dead-lettered (optional; see `make_app`)
- `TASKHERD_SOFT_TIME_LIMIT`, `TASKHERD_TIME_LIMIT`, `TASKHERD_MAX_TASKS_PER_CHILD`,
  `TASKHERD_VISIBILITY_TIMEOUT`: the limits the chart derives the pod's grace period from, so the
  pod and the worker agree on them.
"""
from __future__ import annotations

import importlib
import os

from celery import Celery

import taskherd.worker
from taskherd.worker import profile as _profile

#: taskherd's runtime pieces for Kubernetes: the heartbeat the probes read, the preStop drain, the
#: metrics the operator reads to remove idle workers first, fast recovery of a killed worker's
#: messages on Redis, and the publish-time stamp that makes queue age measurable.
RUNTIME = ("heartbeat", "draining", "metrics", "recovery", "stamping")

QUEUE = os.environ.get("SHOP_QUEUE", "shop")


def _env_float(name: str, default: float) -> float | None:
    value = os.environ.get(name, "")
    return float(value) if value.strip() else default


def make_app(*, broker_url: str, queue: str = QUEUE) -> Celery:
    """The shop's Celery app on `broker_url`. Producers use it too: it declares the queue with the
    same dead-letter arguments the workers do."""
    app = Celery("shop", broker=broker_url, include=["shop.tasks", "shop.db"])
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,  # effects live in PostgreSQL; nobody waits on a result backend
    )
    profile = taskherd.worker.configure(
        app,
        queues=[queue],
        soft_time_limit=_env_float("TASKHERD_SOFT_TIME_LIMIT", 20),
        time_limit=_env_float("TASKHERD_TIME_LIMIT", 30),
        visibility_timeout=_env_float("TASKHERD_VISIBILITY_TIMEOUT", None),
        max_tasks_per_child=int(_env_float("TASKHERD_MAX_TASKS_PER_CHILD", 1000)) or None,
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
    for name in RUNTIME:  # each reads its settings from the TASKHERD_* environment the chart sets
        module = f"taskherd.worker.{name}"
        if module not in _profile._INSTALLERS:  # until configure() runs it itself (then this loop goes)
            importlib.import_module(module).install(app, profile)
    return app


def _broker_url() -> str:
    url = os.environ.get("TASKHERD_BROKER_URL", "")
    if not url:
        raise RuntimeError("TASKHERD_BROKER_URL is not set: the broker URL (redis://… or amqp://…), "
                           "which the chart reads from the Secret named in broker.existingSecret")
    return url


app = make_app(broker_url=_broker_url())
