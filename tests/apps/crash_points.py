"""Test-only hooks that SIGKILL a whole worker (or relay) at a named step of a task's life.

Installed by importing this module (tests/apps/crash_app.py does): it wraps the production
functions at each step, so the production code carries no test branch and pays nothing. A step
kills only when the task's crash plan — the Redis set ``crash-plan:<task id>`` — still lists it:
SREM removes the step (so the redelivery goes past it) and the process group, i.e. the worker's
main process and its pool children (or the relay), is SIGKILLed at once. Every kill is first
recorded in the list ``crashes`` so that the test can prove the crash happened where planned.

Steps, in the order a task meets them (see docs/reliability.md, "The crash-point matrix"):
"""
from __future__ import annotations

import json
import os
import signal
import time

import redis

STEPS = {
    "popped": "main process (Redis): the message is off its queue list, read from the socket, not yet "
              "handed to kombu (kombu's BRPOP left it nowhere else)",
    "received": "main process: the message is in the worker, nothing has run",
    "delivery counted": "a redelivery's count is known, the task has not started (pool child: read from the "
                        "message or the broker; RabbitMQ classic queues, main process: the copy carrying it "
                        "is published, the original not acknowledged)",
    "key claimed": "pool child: the idempotency key is claimed, the effect has not started",
    "effect started": "pool child: the effect is written inside the open transaction",
    "effect committed": "pool child: the store's commit (effect + done mark) returned",
    "done-mark written": "pool child: back in the task after the guard, before it returns",
    "result stored": "pool child: SUCCESS is in the result backend, the message is unacked",
    "ack sent": "main process: the message was acknowledged",
    "retry being published": "pool child: the retry is about to be published",
    "retry published": "pool child: the broker has the retry, the original is unacked",
    "envelope being published": "pool child: the DLQ envelope is about to be published",
    "envelope published": "pool child: the broker has the envelope, the original is unacked",
    "hard-limit envelope published": "main process: the hard time limit's envelope is in the DLQ, not acked",
    "parked": "main process (Redis): the ETA message is in the delay set, the original is unacked",
    "row committed, not relayed": "outbox relay: the row is committed and locked, not published",
    "relayed, row not marked": "outbox relay: the broker has the message, the row is not marked sent",
}
__doc__ += "\n".join(f"- {step}: {where}" for step, where in STEPS.items())

_client: redis.Redis | None = None


def _plans() -> redis.Redis:
    global _client
    if _client is None or getattr(_client, "_pid", None) != os.getpid():
        _client = redis.Redis.from_url(os.environ["TEST_REDIS_URL"])
        _client._pid = os.getpid()
    return _client


def crash_point(step: str, task_id: str | None) -> None:
    """SIGKILL this process group if ``task_id``'s crash plan still lists ``step``."""
    assert step in STEPS, step
    if not task_id:
        return
    client = _plans()
    if client.srem(f"crash-plan:{task_id}", step):
        client.rpush("crashes", json.dumps({"task_id": task_id, "step": step, "pid": os.getpid(), "at": time.time()}))
        os.killpg(0, signal.SIGKILL)


def _current_task_id() -> str | None:
    from celery import current_task

    return current_task.request.id if current_task else None


def strategy(task, app, consumer, **kwargs):
    """The taskherd strategy, with the "received" step in front of it."""
    from taskherd.worker import deliveries

    handle = deliveries.strategy(task, app, consumer, **kwargs)

    def task_message_handler(message, *args, **options):
        crash_point("received", (message.headers or {}).get("id"))
        return handle(message, *args, **options)

    return task_message_handler


def install() -> None:
    from celery.backends.base import Backend
    from kombu.message import Message

    from taskherd.worker import deliveries, delayed, outbox, redis_items
    from taskherd.worker import task as task_module
    from taskherd.worker.idempotency.redis_store import RedisStore

    guarded = redis_items.guarded

    def popped(item, queue, **kwargs):
        # Every Redis item a worker pops passes here first (the bad-message guard), before kombu
        # delivers it: installed before configure() builds the guard from this attribute.
        try:
            task_id = json.loads(item)["headers"]["id"]
        except (TypeError, ValueError, KeyError):
            task_id = None
        crash_point("popped", task_id)
        return guarded(item, queue, **kwargs)

    redis_items.guarded = popped

    count, republish = deliveries.count, deliveries.republish

    def counted(*, task_id, **kwargs):
        found = count(task_id=task_id, **kwargs)
        if found.source != "first delivery":
            crash_point("delivery counted", task_id)
        return found

    def republished(message, *args, **kwargs):
        republish(message, *args, **kwargs)  # the copy carrying the count is confirmed, the original unacked
        crash_point("delivery counted", (message.headers or {}).get("id"))

    deliveries.count, deliveries.republish = counted, republished

    commit = RedisStore._commit

    def committed(self, key, *args, **kwargs):
        commit(self, key, *args, **kwargs)
        crash_point("effect committed", _current_task_id())

    RedisStore._commit = committed

    mark_as_done = Backend.mark_as_done

    def result_stored(self, task_id, *args, **kwargs):
        stored = mark_as_done(self, task_id, *args, **kwargs)
        crash_point("result stored", task_id)
        return stored

    Backend.mark_as_done = result_stored

    ack = Message.ack

    def acknowledged(self, *args, **kwargs):
        ack(self, *args, **kwargs)  # the broker has the ack (Celery's own acknowledge only schedules it)
        crash_point("ack sent", (self.headers or {}).get("id"))

    Message.ack = acknowledged

    retry = task_module.Task.retry

    def retried(self, *args, **kwargs):
        from celery.exceptions import Retry

        crash_point("retry being published", self.request.id)
        try:
            return retry(self, *args, **kwargs)
        except Retry:
            crash_point("retry published", self.request.id)
            raise

    task_module.Task.retry = retried

    dead_letter = task_module._dead_letter

    def dead_lettered(app, profile, envelope):
        step = "envelope" if envelope.reason != "hard-time-limit" else "hard-limit envelope"
        if step == "envelope":
            crash_point("envelope being published", envelope.task_id)
        dead_letter(app, profile, envelope)
        crash_point(f"{step} published", envelope.task_id)

    task_module._dead_letter = dead_lettered

    park = delayed.DelaySet.park

    def parked(self, message, eta):
        park(self, message, eta)
        crash_point("parked", (message.headers or {}).get("id"))

    delayed.DelaySet.park = parked

    publish = outbox.CeleryPublisher.publish

    def relayed(self, rows):
        rows = list(rows)
        for row in rows:
            crash_point("row committed, not relayed", row.id)
        publish(self, rows)
        for row in rows:
            crash_point("relayed, row not marked", row.id)

    outbox.CeleryPublisher.publish = relayed


install()
