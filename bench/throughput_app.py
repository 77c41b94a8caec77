"""The two apps bench/throughput.py compares, chosen by BENCH_VARIANT.

vanilla      Celery with the same ack settings as the profile: acks_late, reject_on_worker_lost,
             prefetch multiplier 1, JSON only.
taskherd     configure(app) (retries, DLQ, delivery counting, heartbeat, metrics, fast recovery on
             Redis) and the Redis idempotency guard keyed on the task id.
profile      configure(app) alone; idempotency: the guard alone (to attribute the overhead).
handrolled   vanilla plus the idempotency key a Celery user writes by hand without taskherd
             (redis-py: SET NX EX to claim, SET to mark done): taskherd's like-for-like baseline for
             a task that guards an effect — the same two round trips, none of taskherd's checks.
profile-X-Y  configure(app) without its components of class X and Y (e.g. profile-Metrics), and
taskherd-X   the same plus the guard: what each component costs.

BENCH_BROKER_URL, BENCH_QUEUE, BENCH_REDIS_URL (idempotency keys),
BENCH_TASK_MS (how long the task sleeps; 0, a no-op, by default),
BENCH_CONF (JSON: Celery settings applied last, e.g. '{"task_time_limit": 3600}' on vanilla to see
what one of the profile's settings costs).
"""
import json
import os
import time

import redis
from app_variants import configure_without, make_vanilla
from celery import Celery

VARIANT = os.environ["BENCH_VARIANT"]
QUEUE = os.environ["BENCH_QUEUE"]
BROKER_URL = os.environ["BENCH_BROKER_URL"]
REDIS_URL = os.environ["BENCH_REDIS_URL"]
#: 0 for the no-op the issue asks for; a few ms shows the overhead on a task that does something
TASK_SECONDS = float(os.environ.get("BENCH_TASK_MS", "0")) / 1000

app = Celery("bench", broker=BROKER_URL, set_as_current=False)
app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True)

#: variant -> (apply the profile?, guard with idempotency?). The two halves of "taskherd" exist to
#: attribute its overhead (bench/throughput.py --variants).
VARIANTS = {"vanilla": (False, False), "taskherd": (True, True), "profile": (True, False), "idempotency": (False, True),
            "handrolled": (False, "by hand")}
BASE_VARIANT, *LEFT_OUT = VARIANT.split("-")
if BASE_VARIANT not in VARIANTS or (LEFT_OUT and BASE_VARIANT not in ("profile", "taskherd")):
    raise SystemExit(f"BENCH_VARIANT={VARIANT!r}; valid: {', '.join(VARIANTS)}, or profile-/taskherd- followed by "
                     "component class names joined by '-' (left out)")
with_profile, with_idempotency = VARIANTS[BASE_VARIANT]

if with_profile:
    try:
        # No Redis on RabbitMQ: the broker counts redeliveries.
        configure_without(app, LEFT_OUT, queues=[QUEUE])
    except ValueError as error:
        raise SystemExit(f"BENCH_VARIANT={VARIANT!r}: {error}") from None
else:
    make_vanilla(app)

app.conf.update(json.loads(os.environ.get("BENCH_CONF") or "{}"))

if with_idempotency:
    from taskherd.worker.idempotency import RedisStore, idempotent

    store = RedisStore(client=redis.Redis.from_url(REDIS_URL))

    @app.task(name="bench.noop", bind=True, ignore_result=True)
    @idempotent(store, key=lambda task: f"bench:{task.request.id}")
    def noop(task):
        if TASK_SECONDS:
            time.sleep(TASK_SECONDS)
elif with_idempotency == "by hand":
    keys = redis.Redis.from_url(REDIS_URL)

    @app.task(name="bench.noop", bind=True, ignore_result=True)
    def noop(task):
        # The usual hand-written guard: claim with a lease, skip a key already done, mark it done.
        # It has no lease renewal, no owner check and no stored result: the least a user writes.
        key = f"bench:{task.request.id}"
        if not keys.set(key, "running", nx=True, ex=30) and keys.get(key) == b"done":
            return
        if TASK_SECONDS:
            time.sleep(TASK_SECONDS)
        keys.set(key, "done", ex=7 * 24 * 3600)
else:
    @app.task(name="bench.noop", ignore_result=True)
    def noop():
        if TASK_SECONDS:
            time.sleep(TASK_SECONDS)
