"""The worker app of the crash-point matrix (tests/recovery/test_crash_matrix.py).

Configured from the environment: TEST_BROKER_URL, TEST_QUEUE, TEST_REDIS_URL (crash plans, the
Redis idempotency store and its effects, the result backend), TEST_PG_DSN
(the PostgreSQL store and its `ledger`). Importing it installs the crash hooks (apps.crash_points).

`crash.effect(store, order, fail=None)` runs one idempotent effect, keyed on the task id, through
the Redis store ("redis": RPUSH effects:<task id>, committed with the done record) or the
PostgreSQL one ("postgres": a `ledger` row, committed with the key row). `fail`: "transient-first"
raises a transient error on the first attempt (a retry follows), "permanent" raises a permanent
one inside the guard (the task is dead-lettered), "hang" ignores its soft limit until the hard one.
Each run appends to `runs:<task id>`.
"""
import os
import socket
import time

import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from apps.crash_points import crash_point
from apps.effects_schema import process_connection
from taskherd.worker import configure
from taskherd.worker.idempotency import PostgresStore, RedisStore

REDIS_URL = os.environ["TEST_REDIS_URL"]
DSN = os.environ.get("TEST_PG_DSN", "")
STRATEGY = "apps.crash_points:strategy"

app = Celery("crash", broker=os.environ["TEST_BROKER_URL"], backend=REDIS_URL)
app.conf.update(broker_connection_retry_on_startup=True, result_expires=None)
configure(app, queues=[os.environ.get("TEST_QUEUE", "crash")], soft_time_limit=8, time_limit=10, max_retries=5,
          backoff_base=0.2, backoff_cap=0.5, max_deliveries=5)

_redis = redis.Redis.from_url(REDIS_URL)
redis_store = RedisStore(client=_redis, lease_seconds=2)
postgres_store = PostgresStore()


@app.task(name="crash.effect", bind=True, Strategy=STRATEGY)
def effect(self, store, order, fail=None):
    task_id = self.request.id
    _redis.rpush(f"runs:{task_id}", f"{socket.gethostname()}:{os.getpid()}:{time.time()}")
    if fail == "transient-first" and not self.request.retries:
        raise ConnectionResetError("the first attempt meets a dropped connection")
    if fail == "hang":
        _hang()
    key = f"task:{task_id}"
    if store == "redis":
        with redis_store.guard(key) as claim:
            if claim.done:
                return claim.result
            crash_point("key claimed", task_id)
            if fail == "permanent":
                raise ValueError(f"order {order} is invalid")
            claim.in_transaction(lambda pipe: pipe.rpush(f"effects:{task_id}", order))
            crash_point("effect started", task_id)
            claim.set_result({"order": order})
    else:
        conn = process_connection(DSN)
        with postgres_store.guard(key, conn=conn) as claim:
            if claim.done:
                return claim.result
            crash_point("key claimed", task_id)
            if fail == "permanent":
                raise ValueError(f"order {order} is invalid")
            conn.execute("INSERT INTO ledger (key, who) VALUES (%s, %s)", (task_id, str(order)))
            crash_point("effect started", task_id)
            claim.set_result({"order": order})
        crash_point("effect committed", task_id)
    crash_point("done-mark written", task_id)
    return {"order": order}


def _hang():
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            time.sleep(0.1)
        except SoftTimeLimitExceeded:
            pass
