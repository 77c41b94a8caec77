"""The base Task class: only transient errors retry, everything else ends in the DLQ with an envelope.

``configure(app)`` makes this the app's default task class (the TaskClass component), so a plain
``@app.task`` gets it; ``@app.task(base=taskherd.worker.Task)`` works as well.

On each delivery, in the pool child, before the task body runs:

1. the delivery's count is read (``deliveries``: from the message or the broker, no round trip on
   a first delivery); past ``max_deliveries`` deliveries the task is dead-lettered unrun — it
   killed its worker on every earlier one;
2. the body runs; an exception is classified (``transient``):
   - transient and ``retries < max_retries``: ``self.retry`` after a full-jitter backoff delay,
     or after the error's own ``retry_after`` when it is longer (a busy idempotency key: the time
     left on its lease);
   - transient and out of retries, or permanent: the envelope is published to the DLQ (the
     broker confirms it), then the exception is re-raised so Celery records the failure and
     acknowledges the message — in that order, so a crash in between duplicates the envelope
     rather than losing the task.
   The soft time limit is held back while the retry or the envelope is published
   (taskherd.worker.soft_limit), so it cannot replace the outcome with a plain failure.

A hard time limit kills the child before it can do anything: :class:`Request` (the main
process's side of a task) publishes that envelope instead, before Celery acknowledges.

A message whose retry or envelope could not be published goes back to its queue
(:meth:`Request.put_back`): published again (confirmed) and then acknowledged, on every broker —
a return to the queue would count as a delivery that killed its worker (taskherd.worker.deliveries,
and on a quorum queue ``x-delivery-limit``, ending in RabbitMQ's native, at-most-once
dead-lettering). If that publish fails too, it is rejected with requeue.

On Redis, ETA/countdown messages do not wait in the worker (taskherd.worker.delayed).
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Any

import celery
from billiard.einfo import ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.exceptions import (Ignore, MaxRetriesExceededError, Reject, Retry, SoftTimeLimitExceeded,
                               TimeLimitExceeded)
from celery.worker.request import Request as CeleryRequest
from celery.worker.state import revoked as revoked_ids

from . import child_deaths, deliveries, soft_limit
from .backoff import backoff_delay
from .components import metrics, recovery
from .deadletter import (FIRST_FAILURE_HEADER, Envelope, Reason, exception_fields,
                         json_safe, publish_envelope)
from .profile import Profile, get_profile
from .publishing import message_properties, publish
from .transient import retry_after

logger = logging.getLogger(__name__)

#: Protocol-2 header names kept in an envelope (with every custom header) so a redrive rebuilds
#: the message faithfully.
_PROTOCOL_HEADERS = ("lang", "task", "id", "shadow", "eta", "expires", "group", "group_index",
                     "retries", "timelimit", "root_id", "parent_id", "argsrepr", "kwargsrepr",
                     "origin", "ignore_result", "replaced_task_nesting")


#: The request key that carries a Redis delivery's tag and the fast-recovery identity it was taken
#: under to the pool child (taskherd.worker.components.recovery.held_as): the child asks Redis
#: whether that identity still owns it before it retries or dead-letters.
HELD_AS = "taskherd_held_as"

#: Keys Celery's Request merges into its request dict that are not message headers.
_MERGED_INTO_REQUEST = frozenset({"args", "kwargs", "delivery_info", "hostname", "reply_to",
                                  "correlation_id", "properties", "is_eager", HELD_AS})


#: Seconds a child waits before requeueing a message it could not dead-letter, so that a DLQ
#: that stays unwritable (full, mis-declared) is retried calmly rather than in a hot loop.
DEAD_LETTER_FAILURE_PAUSE = 1.0

#: Seconds added to an error's ``retry_after`` (a lease's time left is measured when the claim
#: failed; the retry must come after the lease has really expired).
RETRY_AFTER_MARGIN = 0.25


def retry_delay(exc: BaseException, retries: int, profile: Profile) -> float:
    """Seconds before retry number ``retries``: full-jitter backoff, but never before the error's
    own ``retry_after`` (retrying a busy key before its lease can expire only spends the budget)."""
    delay = backoff_delay(retries, base=profile.backoff_base, cap=profile.backoff_cap, rng=profile.backoff_rng)
    wait = retry_after(exc)
    return delay if wait is None else max(delay, wait + RETRY_AFTER_MARGIN)


class PublishFailed(Reject):
    """The retry or the envelope could not be published: the message goes back to its queue."""


class DeadLettered(Exception):
    """The task's message went to the DLQ instead of running (its FAILURE result says why)."""


class TakenBack(Ignore):
    """The delivery went back to its queue while the task ran here (this worker's Redis lease
    lapsed: a partition, a stall): another worker has it, or will, and has the last word on it. A
    retry or an envelope from here would be a second copy; Celery acknowledges an ignored task,
    and that acknowledgement is fenced (it removes nothing the new holder has)."""


def queue_of(app: Any, profile: Profile, delivery_info: dict | None) -> str:
    """The work queue a message came from, from its delivery info.

    A delivery names its exchange and routing key, not its queue: the routing key is the queue
    with Celery's default routing; otherwise a declared queue with that routing key, or the one
    declared queue on that exchange; else the only profiled queue; else the routing key.
    """
    info = delivery_info or {}
    routing_key, exchange = info.get("routing_key"), info.get("exchange")
    if routing_key in profile.queues:
        return routing_key
    declared = list(app.conf.task_queues or ())
    for queue in declared:
        if routing_key and getattr(queue, "routing_key", None) == routing_key:
            return queue.name
    on_exchange = [q.name for q in declared if exchange and getattr(q.exchange, "name", None) == exchange]
    if len(on_exchange) == 1:
        return on_exchange[0]
    if len(profile.queues) == 1 or not routing_key:
        return profile.queues[0]
    return routing_key


def _dead_letter(app: Any, profile: Profile, envelope: Envelope) -> None:
    publish_envelope(envelope, broker_url=profile.broker_url,
                     dead_letter_queue=profile.dead_letter_queue_for(envelope.queue),
                     transport_options=dict(app.conf.broker_transport_options or {}),
                     queue_type=profile.queue_type)
    logger.error("taskherd: %s[%s] dead-lettered to %s: %s (%s)", envelope.task, envelope.task_id,
                 profile.dead_letter_queue_for(envelope.queue), envelope.reason, envelope.detail)
    # Its one outcome: the task_failure Celery signals next for this delivery counts no `failed`.
    metrics.record_final_outcome(envelope.task or "unknown", envelope.task_id, "dead_lettered")


class Task(celery.Task):
    """Celery Task with transient-only retries, a DLQ envelope and a bound on worker-killing deliveries."""

    #: Main-process side of each task: dead-letters hard time limits, puts messages back.
    Request = "taskherd.worker.task:Request"
    #: How the worker takes a message in: on Redis, ETA/countdown messages go to the delay set; on
    #: RabbitMQ classic queues, a redelivered message is replaced by a copy carrying its count.
    Strategy = "taskherd.worker.deliveries:strategy"

    def _count_delivery(self, profile: Profile, request: Any) -> deliveries.Count:
        return deliveries.count(task_id=request.id, retries=request.retries or 0, headers=request.headers,
                                redelivered=bool((request.delivery_info or {}).get("redelivered")),
                                queue_type=profile.queue_type, counter_url=profile.delivery_counter_url,
                                counter_ttl=profile.delivery_counter_ttl)

    #: It records its metrics itself (taskherd.worker.components.metrics.task_started): Celery's
    #: task_prerun/task_postrun signals cost a dispatch per task even with receivers that return at once.
    records_its_own_metrics = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or request.is_eager:
            return super().__call__(*args, **kwargs)
        if not metrics.recording():
            return self._call_in_worker(request, args, kwargs)
        started, succeeded = metrics.task_started(self, request), False
        try:
            result = self._call_in_worker(request, args, kwargs)
            succeeded = True
            return result
        finally:
            metrics.task_ended(self, started, succeeded=succeeded)

    def _call_in_worker(self, request: Any, args: tuple, kwargs: dict) -> Any:
        """A delivery's run in a worker: its count checked against max_deliveries, then the body
        (retried or dead-lettered on an error)."""
        profile = get_profile(self.app)
        # A first delivery (nearly all of them) costs nothing: the count of a redelivery travels
        # with the message or comes from the broker (taskherd.worker.deliveries).
        delivery = self._count_delivery(profile, request)
        if delivery.redeliveries:
            logger.info("taskherd: %s[%s] delivered again, %d earlier deliveries without an outcome (counted by %s)",
                        self.name, request.id, delivery.redeliveries, delivery.source)
        if deliveries.exceeds(delivery.redeliveries, profile.max_deliveries):
            runs = profile.max_deliveries
            self._send_to_dlq(profile, reason=Reason.KILLED_WORKER, attempts=runs,
                              detail=f"delivered {runs} times without finishing: it killed its worker "
                                     f"{runs} times (max_deliveries={runs}); dead-lettered without "
                                     f"running it again")
            delivery.forget()
            raise DeadLettered(f"{self.name}[{request.id}] killed its worker {runs} times: dead-lettered")
        # A Redis counter is forgotten once this delivery has an outcome (the next message, if
        # any, is a retry with its own count); a requeued delivery keeps counting, and so does one
        # taken back while it ran (the run that counts is elsewhere).
        outcome_known = True
        try:
            return self._run_traced(*args, **kwargs)
        except PublishFailed:
            raise  # our requeue is not a worker death: the counter must not grow
        except Reject as rejected:
            outcome_known = not rejected.requeue
            raise
        except (Retry, Ignore):
            raise  # the task's own control flow
        except Exception as exc:
            try:
                self._on_error(profile, exc)
            except PublishFailed:
                raise
            except Reject as rejected:
                outcome_known = not rejected.requeue
                raise
            except TakenBack:
                outcome_known = False
                raise
            raise
        finally:
            if outcome_known:
                delivery.forget()

    def _run_traced(self, *args: Any, **kwargs: Any) -> Any:
        """The body, under Celery's tracer. celery.Task.__call__ would push a copy of the request
        the tracer has just pushed (every field copied, per task) and the task again on the task
        stack; the tracer calls ``run`` directly for a task without a ``__call__`` of its own, and
        so does this, unless a class between this one and celery.Task has a ``__call__`` too."""
        next_call = super().__call__
        if getattr(next_call, "__func__", None) is celery.Task.__call__:
            return self.run(*args, **kwargs)
        return next_call(*args, **kwargs)

    def _on_error(self, profile: Profile, exc: Exception) -> None:
        """Retry (raises Retry) or dead-letter (returns; the caller re-raises ``exc``)."""
        request = self.request
        retries = request.retries or 0
        failed_at = time.time()
        # A header any producer can set: one that is no time is ignored (this failure is the first).
        first_failure = deliveries.header_timestamp((request.headers or {}).get(FIRST_FAILURE_HEADER)) or failed_at
        transient = profile.classifier.is_transient(exc)
        if transient and retries < profile.max_retries:
            self._stop_if_taken_back(exc, "retried")
            delay = retry_delay(exc, retries, profile)
            try:
                with soft_limit.deferred("a retry was being published"):
                    raise self.retry(exc=exc, countdown=delay, max_retries=profile.max_retries,
                                     headers={**(request.headers or {}), FIRST_FAILURE_HEADER: first_failure})
            except Reject as rejected:
                # Celery rejects WITHOUT requeue when publishing the retry fails: on Redis that
                # drops the task. Put it back instead; it will be retried from this message.
                raise PublishFailed(rejected.reason, requeue=True) from exc
        attempts = retries + 1
        if transient:
            reason, detail = Reason.RETRIES_EXHAUSTED, (
                f"{type(exc).__name__} is transient but persisted over {attempts} attempts "
                f"(max_retries={profile.max_retries})")
        elif isinstance(exc, MaxRetriesExceededError):
            # the task's own self.retry() (without exc=) past its max_retries: it asked to be
            # tried again, so its retries ran out; "permanent" would send the reader elsewhere
            reason, detail = Reason.RETRIES_EXHAUSTED, (
                f"its own self.retry() gave up after {retries} retries (the task's max_retries="
                f"{self.max_retries})")
        elif isinstance(exc, SoftTimeLimitExceeded):
            reason, detail = Reason.SOFT_TIME_LIMIT, (
                f"exceeded its soft time limit ({self._soft_time_limit_applied(profile)}s); not retried")
        else:
            reason, detail = Reason.PERMANENT_ERROR, f"{type(exc).__name__} is permanent: not retried"
            if retries:
                # This run was itself a retry (of an earlier transient error, or the task's own
                # autoretry_for giving up): "not retried" alone read as if the task had run once.
                detail += f" (attempt {attempts}, after {retries} retries)"
        self._send_to_dlq(profile, reason=reason, detail=detail, attempts=attempts, exc=exc,
                          first_failure_at=first_failure, failed_at=failed_at)

    def _soft_time_limit_applied(self, profile: Profile) -> Any:
        """The soft time limit this run had: the message's own (``timelimit`` header, [hard, soft],
        from ``apply_async(soft_time_limit=…)``) when set, else the task's, else the profile's —
        the order in which Celery's Request picks it."""
        return soft_limit_applied(self.request.timelimit, self.soft_time_limit, profile.soft_time_limit)

    def _stop_if_taken_back(self, exc: BaseException | None, outcome: str) -> None:
        """Raises TakenBack when Redis fast recovery gave this delivery back to its queue while it
        ran here (a failure path only: one Redis round trip)."""
        held = getattr(self.request, HELD_AS, None)
        if held is None or recovery.child_holds(self.app, held) is not False:
            return
        logger.warning("taskherd: %s[%s] failed (%r) after its delivery went back to the queue (this worker's "
                       "lease lapsed); not %s here: the worker that has it now decides", self.name,
                       self.request.id, exc, outcome)
        raise TakenBack(f"{self.name}[{self.request.id}]: its delivery went back to the queue while it ran")

    def _send_to_dlq(self, profile: Profile, *, reason: str, detail: str, attempts: int,
                     exc: BaseException | None = None, first_failure_at: float | None = None,
                     failed_at: float | None = None) -> None:
        self._stop_if_taken_back(exc, "dead-lettered")
        request = self.request
        now = failed_at or time.time()
        envelope = Envelope(
            reason=reason, detail=detail, queue=queue_of(self.app, profile, request.delivery_info),
            task=self.name, task_id=request.id, args=json_safe(list(request.args or ())),
            kwargs=json_safe(dict(request.kwargs or {})),
            embed=json_safe({"callbacks": request.callbacks, "errbacks": request.errbacks,
                             "chain": request.chain, "chord": request.chord}),
            headers=json_safe(_context_headers(request, self.name)),
            attempts=attempts, first_failure_at=first_failure_at or now, last_failure_at=now,
            hostname=request.hostname or socket.gethostname(),
            exchange=(request.delivery_info or {}).get("exchange"),
            routing_key=(request.delivery_info or {}).get("routing_key"),
            **(exception_fields(exc) if exc is not None else {}),
        )
        with soft_limit.deferred("an envelope was being published"):
            try:
                _dead_letter(self.app, profile, envelope)
            except Exception as publish_error:
                # Not in the DLQ, so it must not be acked: back to the queue, to be tried again.
                logger.exception("taskherd: could not dead-letter %s[%s]; putting it back", self.name, request.id)
                time.sleep(DEAD_LETTER_FAILURE_PAUSE)
                raise PublishFailed(f"dead-lettering failed: {publish_error!r}", requeue=True) from publish_error


def soft_limit_applied(timelimit: Any, task_limit: Any, default: Any) -> Any:
    """The soft time limit of a run: the message's (``timelimit`` = [hard, soft]), else the task's,
    else ``default``; a falsy one is unset, as Celery's Request reads it."""
    message_limit = timelimit[1] if isinstance(timelimit, (list, tuple)) and len(timelimit) == 2 else None
    return message_limit or task_limit or default


def _context_headers(request: Any, name: str) -> dict:
    headers = {key: getattr(request, key, None) for key in _PROTOCOL_HEADERS}
    headers.update(task=name, id=request.id, lang="py", retries=request.retries or 0,
                   group=request.group, timelimit=list(request.timelimit or (None, None)))
    headers.update(request.headers or {})
    return headers


class Request(CeleryRequest):
    """The main process's view of a task: dead-letters hard time limits, puts messages back, names
    the cause of a pool child's death (taskherd.worker.child_deaths)."""

    #: why a hard-timed-out task went back to its queue instead of its DLQ ("" when it did not)
    _put_back_after_timeout = ""
    #: It counts its delivery in the worker's metrics itself: no task_received dispatch per message
    #: (taskherd.worker.components.metrics._per_task_signals).
    counts_its_delivery = True
    _delivery_counted = False

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)
        held = recovery.held_as(message.delivery_tag)
        if held is not None:
            self._request_dict[HELD_AS] = held
        # Counted where Celery would send task_received: at once, unless its strategy will first ask
        # revoked() (an expiry, or a revoked id) and drop the message if so — then by revoked().
        if not (self.expires or self.id in revoked_ids):
            self._record_delivery_metric()

    def revoked(self) -> bool:
        revoked = super().revoked()
        if not revoked:
            self._record_delivery_metric()
        return revoked

    def _record_delivery_metric(self) -> None:
        """taskherd_task_deliveries_total + 1, once per request (not the redelivery count of
        taskherd.worker.deliveries, which the task takes in the pool child)."""
        if not self._delivery_counted:
            self._delivery_counted = True
            metrics.delivery_received(self.name, self.id)  # a new delivery: its outcome is still to come

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        from celery.worker import state

        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if isinstance(exc, TimeLimitExceeded) and self.task.acks_late and not state.should_terminate:
            # billiard sets a hard-timed-out job's result (this call, which acks) BEFORE it calls
            # on_timeout: the envelope must be in the DLQ before super() acknowledges.
            timeout = exc.args[0] if exc.args else self.task.time_limit
            if self._taken_back():
                # Another worker has (or will have) this delivery: dead-lettering it here as well
                # would give it a second envelope, with a reason its new run may not share.
                logger.warning("taskherd: %s[%s] exceeded its hard time limit after its delivery went back to the "
                               "queue (this worker's lease lapsed); not dead-lettered here", self.name, self.id)
                self._put_back_after_timeout = "this worker's lease on it had lapsed"
                state.task_ready(self)
                self.acknowledge()  # fenced: removes nothing another worker holds
                return None
            try:
                self._dead_letter_hard_timeout(timeout)
            except Exception:
                logger.exception("taskherd: could not dead-letter %s[%s] after its hard time limit; "
                                 "putting it back", self.name, self.id)
                self._put_back_after_timeout = "its dead-letter queue could not be written"
                state.task_ready(self)
                self.put_back()
                return None
        elif isinstance(exc, PublishFailed) and exc.requeue:
            state.task_ready(self)
            self.put_back()
            return None
        elif isinstance(exc, WorkerLostError):
            child_deaths.record(self.name, str(exc), task_id=self.id)
        return super().on_failure(exc_info, send_failed_event=send_failed_event, return_ok=return_ok)

    def _taken_back(self) -> bool:
        """Whether Redis fast recovery gave this delivery back to its queue while it ran here."""
        return recovery.holds(getattr(self._message, "delivery_tag", None)) is False

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft and self._put_back_after_timeout:
            # Back on its queue, not failed: no FAILURE result, no failure hooks.
            logger.error("taskherd: hard time limit (%ss) exceeded for %s[%s]; it went back to its queue because "
                         "%s", timeout, self.name, self.id, self._put_back_after_timeout)
            return
        super().on_timeout(soft, timeout)

    def put_back(self) -> None:
        """Return the message to its queue without acknowledging it away (module docstring).

        It is published again (same body and headers, so the same delivery count) and then
        acknowledged: a return to the queue would count as a delivery that killed its worker
        (taskherd.worker.deliveries; a quorum queue's x-delivery-limit too), and a task waiting
        for its DLQ to become writable would end up dead-lettered as `killed-worker`."""
        profile = get_profile(self.task.app)
        try:
            self._publish_again(profile)
        except Exception:
            logger.exception("taskherd: could not publish %s[%s] again; rejecting it back to its queue (this "
                             "return counts as a delivery without an outcome)", self.name, self.id)
        else:
            self.acknowledge()
            return
        self.reject(requeue=True)

    def _publish_again(self, profile: Profile) -> None:
        message = self._message
        info = self.delivery_info or {}
        publish(message.body, broker_url=profile.broker_url, exchange=info.get("exchange") or "",
                routing_key=info.get("routing_key") or queue_of(self.task.app, profile, info),
                transport_options=dict(self.task.app.conf.broker_transport_options or {}),
                headers=dict(message.headers or {}), content_type=message.content_type,
                content_encoding=message.content_encoding, **message_properties(message))

    def _dead_letter_hard_timeout(self, timeout: float) -> None:
        app = self.task.app
        profile = get_profile(app)
        # _request_dict is the message headers plus what Celery merged in from the body and
        # properties; keep the headers only.
        headers = {k: v for k, v in self._request_dict.items() if k not in _MERGED_INTO_REQUEST}
        payload = self._payload
        embed = payload[2] if isinstance(payload, (list, tuple)) and len(payload) > 2 else None
        now = time.time()
        envelope = Envelope(
            reason=Reason.HARD_TIME_LIMIT,
            detail=f"exceeded its hard time limit ({timeout}s); its process was killed; not retried",
            queue=queue_of(app, profile, self.delivery_info), task=self.name, task_id=self.id,
            args=json_safe(list(self.args or ())), kwargs=json_safe(dict(self.kwargs or {})),
            embed=json_safe(embed), headers=json_safe(headers),
            exception_type="billiard.exceptions.TimeLimitExceeded",
            exception_message=f"TimeLimitExceeded({timeout})", traceback=None,
            attempts=(deliveries.header_count(headers.get("retries")) or 0) + 1,
            first_failure_at=deliveries.header_timestamp(headers.get(FIRST_FAILURE_HEADER)) or now,
            last_failure_at=now,
            hostname=self.hostname, exchange=self.delivery_info.get("exchange"),
            routing_key=self.delivery_info.get("routing_key"),
        )
        _dead_letter(app, profile, envelope)
