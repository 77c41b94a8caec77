"""The worker side of `taskherd drain`: stop consuming at once, finish in-flight tasks, give back the rest.

Mechanism (no broker round trip, no signal, no PID needed): `taskherd drain` writes
``drain-request.json`` into the heartbeat directory. This consumer bootstep looks for it on the event
loop's timer every `poll` seconds (default 0.25 s — one failed open() while there is none). On a request it

1. cancels the consumers of all task queues (``Consumer.cancel_task_queue``), so no new message is
   delivered; the broker connection stays open, so the unacknowledged messages of running tasks
   stay with this worker and are acknowledged once when they finish (closing the channel would
   requeue them and they would run twice);
2. rejects with requeue the messages it holds but has not started: ETA/countdown tasks waiting in
   memory, requests waiting for a free pool process, and prefork jobs still in the pool's outbound
   buffer (not yet written to a child);
3. marks the heartbeat ``draining_since`` and refreshes it every `poll` seconds, so the drain command
   sees the worker go idle within a fraction of a second.

Draining is sticky: if the connection is re-established meanwhile, the new task consumer is cancelled
before it consumes. A worker only obeys a request written after it started (a request left in the
emptyDir by a previous container is removed at start). SIGTERM afterwards finds no running task
and the warm shutdown is immediate. Requires the Heartbeat component.

Not returned: requests held by a per-task rate limit bucket; the broker gets them back when the
worker's connection closes at shutdown.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from celery import Celery, bootsteps
from celery.worker import state as worker_state

from taskherd.pod import shared_files

from . import Component, installed, is_seconds, too_long
from taskherd.contract import shown
from .heartbeat import Heartbeat, HeartbeatStep

logger = logging.getLogger(__name__)

#: Seconds between checks for a drain request (and heartbeat refreshes while draining).
DEFAULT_POLL = 0.25


@dataclass(frozen=True, kw_only=True)
class Drain(Component):
    """Obeys `taskherd drain` (the preStop hook): stop consuming, finish in-flight tasks, give back the rest."""

    requires = (Heartbeat,)

    #: seconds between checks for a drain request (one failed open() while there is none)
    poll: float = DEFAULT_POLL

    def problems(self) -> list[str]:
        if not (is_seconds(self.poll) and self.poll > 0):
            return [f"Drain(poll={shown(self.poll)}) must be a positive number of seconds"]
        return too_long("Drain(poll", self.poll)  # the drain loop waits this long between looks

    def install(self, app: Celery, profile: Any = None) -> None:
        app.steps["consumer"].add(DrainStep)


def request_applies(request: dict[str, Any] | None, *, pid: int, started_at: float) -> bool:
    """Whether a drain request is meant for this worker process (pure: tested without a worker)."""
    if not request:
        return False
    if request.get("pid") not in (None, pid):
        return False
    return float(request.get("requested_at") or 0) >= started_at


def _give_back(request: Any) -> None:
    worker_state.task_ready(request)
    request.reject(requeue=True)


def return_unstarted(c: Any) -> int:
    """Rejects (requeue) the messages this worker holds but has not started; returns how many.

    Three places hold them: the timer (ETA/countdown tasks), the pool semaphore's waiters
    (prefork with the event loop: a request waits there until a child is free) and the prefork
    pool's outbound buffer (handed to the pool, not yet written to a child).
    """
    returned = 0
    for request in tuple(worker_state.scheduled_requests):
        entry = getattr(request, "_eta_timer_entry", None)
        if entry is not None:
            c.timer.cancel(entry)
        _give_back(request)
        c.qos.decrement_eventually()
        returned += 1

    semaphore = getattr(getattr(c, "controller", None), "semaphore", None)
    waiting = getattr(semaphore, "_waiting", None)
    if waiting:
        for waiter in tuple(waiting):
            _callback, args, _kwargs = waiter
            request = args[0] if args else None
            if request in worker_state.reserved_requests and not request.time_start:
                waiting.remove(waiter)
                _give_back(request)
                returned += 1

    pool = getattr(c.pool, "_pool", None)
    outbound = getattr(pool, "outbound_buffer", None)
    if outbound:
        for request in tuple(worker_state.reserved_requests):
            if request.time_start or request in worker_state.active_requests or request._apply_result is None:
                continue
            job = request._apply_result()
            # Only a job no child has seen: not accepted, no write started.
            if job is None or job._accepted or job._write_to is not None or job not in outbound:
                continue
            outbound.remove(job)
            pool._cache.pop(job._job, None)
            _give_back(request)
            returned += 1
    return returned


class DrainStep(bootsteps.StartStopStep):
    """Consumer bootstep: obeys drain requests written by `taskherd drain`."""

    name = "taskherd.worker.components.drain.DrainStep"
    requires = ("celery.worker.consumer.tasks:Tasks", HeartbeatStep)

    def __init__(self, c: Any, **kwargs: Any):
        super().__init__(c, **kwargs)
        self.poll = float((installed(c.app, Drain) or Drain()).poll)
        self.timer_entry = None
        self.heartbeat: HeartbeatStep = c.taskherd_heartbeat
        self.path = shared_files.drain_request_path(self.heartbeat.directory)
        # Left by a previous container in the same emptyDir: not for us.
        shared_files.remove(self.path)

    @property
    def draining(self) -> bool:
        return self.heartbeat.draining_since is not None

    def start(self, c: Any) -> None:
        if self.draining:  # reconnected while draining: cancel the fresh consumer before it consumes
            self._stop_consuming(c)
        self._cancel_timer(c)
        self.timer_entry = c.timer.call_repeatedly(self.poll, self.check, (c,), priority=5)

    def stop(self, c: Any) -> None:
        self._cancel_timer(c)

    shutdown = stop

    def check(self, c: Any) -> None:
        if self.draining:
            return_unstarted(c)
            self.heartbeat.write(c)
            return
        try:
            request = shared_files.read_json(self.path)
        except (OSError, ValueError) as exc:
            logger.warning("taskherd: ignoring unreadable drain request: %s", exc)
            shared_files.remove(self.path)
            return
        if request_applies(request, pid=os.getpid(), started_at=self.heartbeat.started_at):
            self.begin(c)

    def begin(self, c: Any) -> None:
        self.heartbeat.draining_since = time.time()
        self._stop_consuming(c)
        returned = return_unstarted(c)
        logger.warning("taskherd: draining: stopped consuming; %d task(s) running, %d returned to the queue",
                       len(worker_state.active_requests), returned)
        self.heartbeat.write(c)

    def _stop_consuming(self, c: Any) -> None:
        consumer = getattr(c, "task_consumer", None)
        if consumer is None:
            return
        for queue in list(consumer.queues):
            try:
                c.cancel_task_queue(queue.name)
            except c.connection_errors + c.channel_errors as exc:
                # The connection is going: start() cancels the new consumer after reconnecting.
                logger.warning("taskherd: draining: could not cancel consumer of %s: %r", queue.name, exc)

    def _cancel_timer(self, c: Any) -> None:
        if self.timer_entry is not None:
            c.timer.cancel(self.timer_entry)
            self.timer_entry = None
