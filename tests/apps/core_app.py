"""A Celery app under the taskherd profile, for the reliability-core tests (tests/worker/).

Configured from the environment: TEST_BROKER_URL, TEST_QUEUE, TEST_RECORD_URL (a Redis database
where tasks record what they did), TEST_KEYPREFIX (Redis global_keyprefix), TEST_RESTORE_SWEEP=1
(kombu's visibility sweep every second), TEST_TASK_TIME_LIMIT (registers core.own_time_limit with
that limit), TEST_FAST_RECOVERY=0 (leaves the FastRecovery component out), TEST_LATE_BROKER_URL
(set as the broker URL after configure(), a mistake the worker refuses), and TEST_* knobs for
the profile.
"""
import os
import signal
import time

import celery
import psycopg
import redis
from celery import Celery

from taskherd.worker import PermanentError, configure, default_components, without
from taskherd.worker.components.recovery import FastRecovery
from taskherd.worker.idempotency import RedisStore, idempotent

env = os.environ.get
app = Celery("core", broker=env("TEST_BROKER_URL"))
app.conf.update(broker_connection_retry_on_startup=True, worker_hijack_root_logger=True)
if env("TEST_KEYPREFIX"):
    app.conf.broker_transport_options = {"global_keyprefix": env("TEST_KEYPREFIX")}
if env("TEST_RESTORE_SWEEP"):
    # kombu's sweep for unacked messages older than the visibility timeout: every second, not 100 s.
    app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}),
                                         "unacked_restore_interval": 1, "unacked_restore_throttle": 1}

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
    components=without(default_components(), FastRecovery) if env("TEST_FAST_RECOVERY") == "0" else None,
    prefetch_multiplier=int(env("TEST_PREFETCH_MULTIPLIER", "1")),
)

if env("TEST_LATE_BROKER_URL"):  # a newcomer's mistake: the URL set after configure()
    app.conf.broker_url = env("TEST_LATE_BROKER_URL")

_record = redis.Redis.from_url(env("TEST_RECORD_URL")) if env("TEST_RECORD_URL") else None


def record(key: str, value: str = "") -> None:
    _record.rpush(key, f"{time.time()}|{os.getpid()}|{value}")


if env("TEST_TASK_TIME_LIMIT"):
    @app.task(name="core.own_time_limit", time_limit=float(env("TEST_TASK_TIME_LIMIT")))
    def own_time_limit():
        """A task with a hard time limit of its own (not the app's)."""


@app.task(name="core.record")
def record_task(key, value=""):
    record(key, value)
    return value


@app.task(name="core.custom_headers", bind=True)
def custom_headers(self, key):
    """Records the headers a producer added, as the task sees them (task.request.headers)."""
    record(key, repr(sorted((self.request.headers or {}).items())))


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


@app.task(name="core.retries_itself", bind=True, max_retries=2)
def retries_itself(self, key):
    """Asks to be tried again every time, with self.retry() and no exc=: Celery raises
    MaxRetriesExceededError once max_retries=2 retries ran."""
    record(key, str(self.request.retries))
    raise self.retry(countdown=0.2)


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


class DatabaseTask(celery.Task):
    """A base class of the app's own, as Celery's guide writes one (``from celery import Task``):
    tests/worker/test_user_base_class.py checks that its tasks keep taskherd's promises."""

    def on_success(self, retval, task_id, args, kwargs):
        record(args[0] + ":on_success")


@app.task(name="core.based_flaky", bind=True, base=DatabaseTask)
def based_flaky(self, key):
    """Fails with a transient error on its first run, then succeeds."""
    record(key, str(self.request.retries))
    if self.request.retries == 0:
        raise ConnectionResetError("upstream reset the connection")


@app.task(name="core.based_validation", base=DatabaseTask)
def based_validation(key):
    record(key)
    raise ValueError("not a valid order")


@app.task(name="core.based_kill_worker", base=DatabaseTask)
def based_kill_worker(key):
    record(key)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="core.autoretry", bind=True, autoretry_for=(KeyError,),
          retry_kwargs={"max_retries": 2, "countdown": 0.2})
def autoretry(self, key):
    """Celery's own autoretry_for, as users write it: KeyError is retried by Celery, not by taskherd."""
    record(key, str(self.request.retries))
    raise KeyError(key)


@app.task(name="core.allocate")
def allocate(key, megabytes):
    """Grows its process by `megabytes`, page by page (a report that does not fit its memory limit)."""
    record(key + ":start")
    held = bytearray(megabytes * 1024 * 1024)
    for offset in range(0, len(held), 4096):
        held[offset] = 1
    record(key + ":done")


@app.task(name="core.ignores_soft_limit")
def ignores_soft_limit(key):
    record(key)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            time.sleep(0.1)
        except Exception:  # noqa: BLE001 - a task that swallows SoftTimeLimitExceeded
            pass


@app.task(name="core.fails_after")
def fails_after(key, seconds):
    """Fails permanently after ``seconds``: with a soft limit just after, its envelope is being
    published (or the pause after a failed publish is running) when the soft limit expires."""
    record(key)
    time.sleep(seconds)
    raise ValueError(f"failed after {seconds}s")


@app.task(name="core.transient_after")
def transient_after(key, seconds):
    """Fails with a transient error after ``seconds`` (it would be retried)."""
    record(key)
    time.sleep(seconds)
    raise ConnectionResetError(f"upstream reset the connection after {seconds}s")


class OperationalError(Exception):
    """Django's ``django.db.utils.OperationalError``: raised ``from`` the driver's own error."""


@app.task(name="core.wrapped_db_error")
def wrapped_db_error(key):
    """The database is unreachable, as an ORM reports it: a wrapper raised from psycopg's error."""
    record(key)
    try:
        psycopg.connect("postgresql://taskherd@127.0.0.1:1/nowhere", connect_timeout=2)
    except psycopg.OperationalError as exc:
        raise OperationalError(str(exc)) from exc


# Leases as short as the test asks, so that a dead holder's key frees itself within the test.
_store = RedisStore(client=_record, lease_seconds=float(env("TEST_LEASE_SECONDS", "3"))) if _record else None


@app.task(name="core.dies_after_claim", bind=True)
def dies_after_claim(self, key):
    """Claims its idempotency key, and on its first run dies holding it (think: the OOM killer)."""
    record(key + ":runs")
    return _dies_after_claim(self, key)


def _guarded_by_task_id(fn):
    return idempotent(_store, key=lambda task, key: f"task:{task.request.id}")(fn) if _store else fn


@_guarded_by_task_id
def _dies_after_claim(task, key):
    if _record.llen(key + ":runs") == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    record(key, "effect")
    return "done"
