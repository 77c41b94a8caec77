"""The sample Celery app the chart's cluster tests install (mounted from a ConfigMap, not a package).

It takes everything from the environment the chart sets (the chart <-> worker contract of
docs/chart.md) and installs taskherd's runtime pieces by hand (heartbeat, drain, metrics), as a
user's app does until `taskherd.worker.configure` reads that environment itself.
Tasks record what they did in Redis (TEST_LEDGER_URL): `runs:<key>` counts executions, and the
side effect `effect:<key>` is guarded by SET NX, so it happens once per key however often a task
is delivered.
"""
import os
import time

import redis
from celery import Celery

from taskherd.worker import draining, heartbeat, metrics

env = os.environ
app = Celery("chart_app", broker=env["TASKHERD_BROKER_URL"])
app.conf.update(
    task_default_queue=env["TASKHERD_QUEUES"].split(",")[0],
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_soft_time_limit=float(env["TASKHERD_SOFT_TIME_LIMIT"]),
    task_time_limit=float(env["TASKHERD_TIME_LIMIT"]),
    broker_transport_options={"visibility_timeout": float(env["TASKHERD_VISIBILITY_TIMEOUT"])},
    accept_content=["json"],
    worker_cancel_long_running_tasks_on_connection_loss=False,
)
heartbeat.install(app)
draining.install(app)
metrics.install(app)

_ledger = None


def ledger() -> redis.Redis:
    global _ledger
    if _ledger is None:
        _ledger = redis.Redis.from_url(env["TEST_LEDGER_URL"])
    return _ledger


@app.task(name="chart.work")
def work(key: str, seconds: float) -> str:
    ledger().incr(f"runs:{key}")
    time.sleep(seconds)
    if ledger().set(f"effect:{key}", os.environ.get("POD_NAME", "?"), nx=True):
        ledger().incr("effects")
    ledger().sadd("done", key)
    return key
