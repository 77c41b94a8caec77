"""A Celery app whose one task records an idempotent effect, for the whole-worker SIGKILL and
outbox tests. Configured from the environment:

TEST_BROKER_URL, TEST_QUEUE, TEST_PG_DSN      where to consume and where the ledger lives
TEST_VISIBILITY_TIMEOUT                       Redis: seconds before an unacked message is restored
                                              (time limits are set below it)
TEST_FAST_RECOVERY=0                          leaves the FastRecovery component out (the visibility
                                              timeout is then the only way back for a dead worker's task)
TEST_SLOW_FIRST_SECONDS                       the first attempt of each task sleeps this long (so a
                                              test can kill it mid-task) ...
TEST_SLOW_FIRST_AT                            ... "inside" its transaction (the effect is not committed
                                              yet) or "after" it (committed, message not yet acked)

TEST_REDIS_URL                                Redis for `effects.redis_record`

`effects.redis_record(order)` appends to the Redis lists `attempts:<task id>` (every run) and,
guarded by the Redis idempotency store keyed on the task id, `ledger:<task id>`, then holds the
key for a second so that a duplicate delivery overlaps it.

`effects.record(order)` appends a row to `attempts` (committed at once: it survives a kill), then,
guarded by the PostgreSQL idempotency store keyed on the task id, appends `order` to `ledger` in
the same transaction as the key. attempts counts runs; ledger counts effects.
"""
import os
import socket
import time
import warnings

import psycopg
import redis
from celery import Celery

from apps.effects_schema import process_connection
from taskherd.worker import ProfileWarning, configure, default_components, without
from taskherd.worker.components.recovery import FastRecovery
from taskherd.worker.idempotency import PostgresStore, RedisStore, idempotent

BROKER_URL = os.environ["TEST_BROKER_URL"]
QUEUE = os.environ.get("TEST_QUEUE", "celery")
DSN = os.environ.get("TEST_PG_DSN", "")
SLOW_FIRST_SECONDS = float(os.environ.get("TEST_SLOW_FIRST_SECONDS", "0"))
SLOW_FIRST_AT = os.environ.get("TEST_SLOW_FIRST_AT", "inside")

app = Celery("effects", broker=BROKER_URL)
app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)
visibility = float(os.environ.get("TEST_VISIBILITY_TIMEOUT", "0"))
components = without(default_components(), FastRecovery) if os.environ.get("TEST_FAST_RECOVERY") == "0" else None
if BROKER_URL.startswith("redis"):
    # Sweep for expired unacked messages every second instead of kombu's 10 s x 10 throttle.
    app.conf.broker_transport_options = {"unacked_restore_interval": 1, "unacked_restore_throttle": 1}
if visibility:
    # A short visibility timeout needs time limits below it (configure() checks that).
    configure(app, soft_time_limit=visibility * 0.5, time_limit=visibility * 0.8, visibility_timeout=visibility,
              backoff_base=0.1, backoff_cap=0.1, components=components)
else:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileWarning)  # no delivery counter on RabbitMQ here
        configure(app, components=components)

store = PostgresStore()


def _connection() -> psycopg.Connection:
    return process_connection(DSN)


def _attempt(task) -> int:
    conn = _connection()
    conn.execute("INSERT INTO attempts (task_id, hostname) VALUES (%s, %s)",
                 (task.request.id, task.request.hostname or socket.gethostname()))
    return conn.execute("SELECT count(*) FROM attempts WHERE task_id = %s", (task.request.id,)).fetchone()[0]


@app.task(name="effects.record", bind=True)
def record(task, order):
    attempt = _attempt(task)
    result = _record(task, order, attempt=attempt, conn=_connection())
    if attempt == 1 and SLOW_FIRST_SECONDS and SLOW_FIRST_AT == "after":
        _hold(task, "is committed, holds its message unacknowledged")
    return result


def _hold(task, state: str) -> None:
    print(f"effects: first attempt of {task.request.id} {state} for {SLOW_FIRST_SECONDS}s", flush=True)
    time.sleep(SLOW_FIRST_SECONDS)


@idempotent(store, key=lambda task, order, **_: f"task:{task.request.id}", connection=lambda *_, conn, **__: conn)
def _record(task, order, *, attempt, conn):
    conn.execute("INSERT INTO ledger (key, who) VALUES (%s, %s)", (f"task:{task.request.id}", str(order)))
    if attempt == 1 and SLOW_FIRST_SECONDS and SLOW_FIRST_AT == "inside":
        _hold(task, "holds its transaction open")
    return {"order": order, "attempt": attempt}


# Connects lazily: apps that never run effects.redis_record need no TEST_REDIS_URL.
redis_client = redis.Redis.from_url(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:1/0"))
redis_store = RedisStore(client=redis_client, lease_seconds=5)


@app.task(name="effects.redis_record", bind=True)
def redis_record(task, order):
    redis_client.rpush(f"attempts:{task.request.id}", task.request.hostname or socket.gethostname())
    return _redis_record(task, order)


@idempotent(redis_store, key=lambda task, order: f"task:{task.request.id}")
def _redis_record(task, order):
    redis_client.rpush(f"ledger:{task.request.id}", order)
    time.sleep(1)
    return {"order": order}
