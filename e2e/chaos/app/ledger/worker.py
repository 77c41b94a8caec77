"""The app the worker pods run (`celery --app=ledger.worker`) and the outbox relay loads
(`taskherd outbox relay -A ledger.worker:app`), configured from the pod's environment:

- `TASKHERD_BROKER_URL`            the broker (from the chart's Secret)
- `TASKHERD_DELIVERY_COUNTER_URL`  RabbitMQ: the Redis counting deliveries (optional)
- `LEDGER_QUEUE_TYPE`              `classic` (default) or `quorum`
- `LEDGER_DATABASE_URL`, `LEDGER_STORE_URL`: the effects' PostgreSQL and the Redis store
"""
from __future__ import annotations

import os

from .app import make_app

_url = os.environ.get("TASKHERD_BROKER_URL", "")
if not _url:
    raise RuntimeError("TASKHERD_BROKER_URL is not set: the broker URL (redis://… or amqp://…)")

app = make_app(broker_url=_url, queue_type=os.environ.get("LEDGER_QUEUE_TYPE") or "classic",
               delivery_counter_url=os.environ.get("TASKHERD_DELIVERY_COUNTER_URL") or None)
app.conf.include = ["ledger.tasks", "ledger.db"]
