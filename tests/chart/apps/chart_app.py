"""The sample Celery app the chart's cluster tests install (mounted from a ConfigMap, not a package).

It calls `taskherd.worker.configure(app)` as a user's app does, which takes everything from the
environment the chart sets (the contract of docs/chart.md: broker, queues, limits, heartbeat,
metrics port).
Tasks record what they did in Redis (TEST_LEDGER_URL): `runs:<key>` counts executions, and the
side effect `effect:<key>` is guarded by SET NX, so it happens once per key however often a task
is delivered. Run as Celery beat, the app sends `chart.tick` every TEST_BEAT_SECONDS (default 1),
naming the beat's pod: the ticks show which beat ran when (`ticks:<pod>`, publish times).
`chart.refuse` fails for good: the worker dead-letters it at once (the monitoring test's page).
"""
import os
import time

import redis
from celery import Celery

from taskherd.worker import PermanentError, configure
from taskherd.worker.components.metrics import published_at

app = Celery("chart_app")
app.conf.broker_connection_retry_on_startup = True
configure(app)
app.conf.beat_schedule = {"chart-tick": {"task": "chart.tick", "schedule": float(os.environ.get("TEST_BEAT_SECONDS", "1")),
                                         "args": (os.environ.get("POD_NAME", "?"),)}}

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


@app.task(name="chart.tick", bind=True)
def tick(self, beat_pod: str) -> None:
    """One periodic send of the beat on `beat_pod`, recorded with the time beat published it."""
    ledger().zadd(f"ticks:{beat_pod}", {self.request.id: published_at(self.request) or time.time()})
    ledger().sadd("beats", beat_pod)


@app.task(name="chart.refuse")
def refuse(reason: str) -> None:
    """A task that can never succeed: no retry, straight to the queue's DLQ."""
    raise PermanentError(reason)
