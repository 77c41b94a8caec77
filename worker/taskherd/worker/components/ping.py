"""The ``taskherd.ping`` task: proof that a pool runs tasks, end to end.

`taskherd ping` (and the chart's `helm test`) publishes ``taskherd.ping`` on a pool's queue, as a
producer of the app does, and waits on a reply queue of its own. A worker that consumes the queue
runs the task in a pool process and publishes the answer to that reply queue through the default
exchange, so a pong proves every step: the broker reachable, a worker consuming the queue, a pool
process running a task, and the worker publishing. No result backend is needed.

An answer that would arrive after the caller's deadline is not sent: the caller has given up and
removed its reply queue (on Redis a late answer would create a list nobody reads).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from celery import Celery

from . import Component

#: the task's name, registered in every app configure() sets up
TASK_NAME = "taskherd.ping"


def answer(*, token: str, hostname: str | None, pid: int, now: float) -> dict[str, Any]:
    """The reply a worker sends: the caller's token and which worker process ran the ping."""
    return {"token": token, "hostname": hostname, "pid": pid, "ran_at": now}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ping(Component):
    """Registers ``taskherd.ping`` in the app (and nothing else: no signal, no thread)."""

    def install(self, app: Celery, profile: Any = None) -> None:
        @app.task(name=TASK_NAME, bind=True, shared=False, ignore_result=True)
        def ping(task: Any, reply_queue: str, token: str, deadline: float) -> None:
            now = time.time()
            if now > deadline:
                return
            body = answer(token=token, hostname=task.request.hostname, pid=os.getpid(), now=now)
            with task.app.producer_or_acquire() as producer:
                producer.publish(body, exchange="", routing_key=reply_queue, serializer="json",
                                 retry=True, retry_policy={"max_retries": 3})
