"""A Celery app under the taskherd profile, for the reliability-core tests (tests/worker/).

Configured from the environment: TEST_BROKER_URL, TEST_QUEUE, TEST_RECORD_URL (a Redis database
where tasks record what they did), and TEST_* knobs for the profile.
"""
import os
import signal
import time

import redis
from celery import Celery

from taskherd.worker import PermanentError, configure

env = os.environ.get
app = Celery("core", broker=env("TEST_BROKER_URL"))
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=True)

configure(
    app,
    queues=[env("TEST_QUEUE", "core")],
    soft_time_limit=float(env("TEST_SOFT_TIME_LIMIT", "20")),
    time_limit=float(env("TEST_TIME_LIMIT", "30")),
    visibility_timeout=float(env("TEST_VISIBILITY_TIMEOUT")) if env("TEST_VISIBILITY_TIMEOUT") else None,
    max_retries=int(env("TEST_MAX_RETRIES", "3")),
    backoff_base=float(env("TEST_BACKOFF_BASE", "0.5")),
    backoff_cap=float(env("TEST_BACKOFF_CAP", "10")),
    # The retry test checks that delays grow: draw the top of each jitter interval.
    backoff_rng=(lambda: 1.0) if env("TEST_JITTER") == "max" else None,
    max_deliveries=int(env("TEST_MAX_DELIVERIES", "5")),
    delivery_counter_url=env("TEST_COUNTER_URL") or None,
    queue_type=env("TEST_QUEUE_TYPE", "classic"),
)

_record = redis.Redis.from_url(env("TEST_RECORD_URL")) if env("TEST_RECORD_URL") else None


def record(key: str, value: str = "") -> None:
    _record.rpush(key, f"{time.time()}|{os.getpid()}|{value}")


@app.task(name="core.record")
def record_task(key, value=""):
    record(key, value)
    return value


@app.task(name="core.sink")
def sink(*args, **kwargs):
    """Takes any arguments: each message that reaches it ran once (the property tests count runs)."""
    record("sink", repr((args, kwargs))[:200])


@app.task(name="core.slow")
def slow(key, seconds):
    record(key + ":start")
    time.sleep(seconds)
    record(key + ":done")


@app.task(name="core.always_transient")
def always_transient(key):
    record(key)
    raise ConnectionResetError("upstream reset the connection")


@app.task(name="core.validation", bind=True)
def validation(self, key, amount, *, currency="EUR"):
    record(key, str(self.request.retries))
    raise ValueError(f"amount must be positive, got {amount}")


@app.task(name="core.fails_while_flag")
def fails_while_flag(key, flag):
    """Fails (permanently) while the Redis key `flag` exists: a bug fixed later, then redriven."""
    record(key)
    if _record.exists(flag):
        raise PermanentError(f"{flag} is set")
    return "ok"


@app.task(name="core.kill_worker")
def kill_worker(key):
    """A message that kills its process every time (think: segfault or OOM kill)."""
    record(key)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="core.ignores_soft_limit")
def ignores_soft_limit(key):
    record(key)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            time.sleep(0.1)
        except Exception:  # noqa: BLE001 - a task that swallows SoftTimeLimitExceeded
            pass
