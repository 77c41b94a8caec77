"""A Celery app with only taskherd's runtime components (heartbeat, drain, metrics), without the profile.

Configured like taskherd's reliability profile (acks_late, reject_on_worker_lost, prefetch 1, time
limits) by hand, so the runtime parts are tested on their own. Environment:
TEST_BROKER_URL, TEST_QUEUE, TEST_LEDGER_URL (a Redis URL where tasks record what they did),
TASKHERD_HEARTBEAT_DIR, TASKHERD_HEARTBEAT_INTERVAL, TEST_METRICS_PORT (metrics when set).
"""
import os
import time

import redis
from celery import Celery

from taskherd.worker import components
from taskherd.worker.components.drain import Drain
from taskherd.worker.components.heartbeat import Heartbeat
from taskherd.worker.components.metrics import Metrics, record_outcome

app = Celery("runtime_app", broker=os.environ["TEST_BROKER_URL"])
app.conf.update(
    task_default_queue=os.environ.get("TEST_QUEUE", "celery"),
    broker_connection_retry_on_startup=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=int(os.environ.get("TEST_PREFETCH_MULTIPLIER", 1)),
    task_soft_time_limit=float(os.environ.get("TEST_SOFT_TIME_LIMIT", 40)),
    task_time_limit=float(os.environ.get("TEST_TIME_LIMIT", 50)),
    worker_max_tasks_per_child=int(os.environ.get("TEST_MAX_TASKS_PER_CHILD", 0)) or None,
    accept_content=["json"],
    worker_cancel_long_running_tasks_on_connection_loss=False,
)
components.install(app, [Heartbeat.from_env(), Drain(poll=0.1)])
if os.environ.get("TEST_METRICS_PORT"):
    components.install(app, [Metrics(port=int(os.environ["TEST_METRICS_PORT"]), address="127.0.0.1")])

_ledger = None


def ledger() -> redis.Redis:
    global _ledger
    if _ledger is None:
        _ledger = redis.Redis.from_url(os.environ["TEST_LEDGER_URL"])
    return _ledger


@app.task(name="runtime.sleep")
def sleep(key: str, seconds: float) -> str:
    ledger().incr(f"runs:{key}")
    ledger().rpush("started", key)
    time.sleep(seconds)
    ledger().rpush("done", key)
    return key


@app.task(name="runtime.fail")
def fail(key: str) -> None:
    ledger().incr(f"runs:{key}")
    raise ValueError(f"task {key} fails on purpose")


@app.task(name="runtime.retry_once", bind=True, max_retries=3)
def retry_once(self, key: str) -> str:
    if ledger().incr(f"runs:{key}") == 1:
        raise self.retry(countdown=0)
    return key


@app.task(name="runtime.record")
def record(key: str, outcome: str) -> None:
    """Records an outcome the way the DLQ (taskherd.worker.task) and other modules do, without a profile."""

    ledger().incr(f"runs:{key}")
    record_outcome("runtime.record", outcome)
