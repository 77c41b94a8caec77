"""The sample Celery app the chart's cluster tests install (mounted from a ConfigMap, not a package).

It calls `taskherd.worker.configure(app)` as a user's app does, which takes everything from the
environment the chart sets (the contract of docs/chart.md: broker, queues, limits, heartbeat,
metrics port).
Tasks record what they did in Redis (TEST_LEDGER_URL): `runs:<key>` counts executions, and the
side effect `effect:<key>` is guarded by SET NX, so it happens once per key however often a task
is delivered.
"""
import os
import time

import redis
from celery import Celery

from taskherd.worker import configure

app = Celery("chart_app")
app.conf.broker_connection_retry_on_startup = True
configure(app)

_ledger = None


def ledger() -> redis.Redis:
    global _ledger
    if _ledger is None:
        _ledger = redis.Redis.from_url(os.environ["TEST_LEDGER_URL"])
    return _ledger


@app.task(name="chart.work")
def work(key: str, seconds: float) -> str:
    ledger().incr(f"runs:{key}")
    time.sleep(seconds)
    if ledger().set(f"effect:{key}", os.environ.get("POD_NAME", "?"), nx=True):
        ledger().incr("effects")
    ledger().sadd("done", key)
    return key
