"""The worker's consumer: a message it cannot run goes to the DLQ with the reason, never silently away.

Left to itself, Celery logs and acks a message it cannot decode; rejects (drops, on Redis) one
that names an unknown task or carries an ETA it cannot convert; lets an exception it did not
foresee (a protocol-2 message without an ``id`` header, say) escape into the event loop, which
restarts the connection and redelivers the same message in a loop; and checks the shape of a
protocol-2 body only in the pool child, where ``kwargs`` as a list is a FAILURE that gets acked
and ``args: "ab"`` runs as ``f("a", "b")``. On Redis, an item that is not a kombu message at all
ends the consumer before any of this.

This subclass, installed as ``worker_consumer`` by the BadMessages component, checks every
message in the main process before Celery turns it into a request (:mod:`taskherd.worker.task_messages`:
content type and encoding, headers, body shape, arguments against the task's signature), has each
Redis item checked as it is popped (:mod:`taskherd.worker.redis_items`), and turns every message
it cannot run into a DLQ envelope — with the raw bytes base64-encoded, since they could not be
decoded or must not be (pickle is refused before anything is unpickled) — then acks it and goes
on consuming. A message whose envelope cannot be published is not acked: it goes back.

It also declares each work queue's DLQ when the connection starts (RabbitMQ), so native
dead-lettering has somewhere to go before the first envelope is ever published.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from celery import bootsteps
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import ContentDisallowed
from kombu.serialization import prepare_accept_content
from vine import promise

from taskherd import compat
from taskherd.worker import decompression, redis_items, task_messages
from taskherd.worker.amqp_properties import UNREADABLE_HEADERS
from taskherd.worker.deadletter import (Envelope, Reason, dead_letter_queue_declaration, exception_fields,
                                       json_safe, publish_envelope, raw_body_fields)
from taskherd.worker.profile import Profile, get_profile
from taskherd.worker.task import queue_of

from . import Component, metrics

logger = logging.getLogger(__name__)


def _headers_of(message: Any) -> dict:
    headers = getattr(message, "headers", None)
    return headers if isinstance(headers, dict) else {}


#: Exceptions that say "this message is malformed", whatever a transport files them under.
_MESSAGE_FAULTS = (LookupError, TypeError, ValueError, AttributeError, UnicodeError)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why a message cannot run: the envelope's reason and detail, and the exception if one said so."""

    reason: str
    detail: str
    exc: BaseException | None = None


def unreadable_item_problem(message: Any) -> str | None:
    """The problem of a Redis item that was not a kombu message (see redis_items), else None."""
    problem = _headers_of(message).get(redis_items.UNREADABLE_HEADER)
    if problem is not None and getattr(message, "content_type", None) == redis_items.UNREADABLE_CONTENT_TYPE:
        return str(problem)
    return None


def verdict_on(message: Any, *, accepted: set[str], tasks: dict) -> Verdict | None:
    """Why ``message`` cannot run, or None when Celery may take it (an unknown task name is left
    to Celery, which reports it through ``on_unknown_task``)."""
    unreadable = unreadable_item_problem(message)
    if unreadable:
        return Verdict(Reason.UNDECODABLE, f"not a kombu message: {unreadable}")
    unreadable = _headers_of(message).get(UNREADABLE_HEADERS)
    if unreadable:
        return Verdict(Reason.UNDECODABLE, f"AMQP headers could not be decoded: {unreadable}")
    problem = task_messages.refused_content_problem(message.content_type, accepted)
    if problem:
        return Verdict(Reason.CONTENT_REFUSED, problem)
    problem = task_messages.encoding_problem(message.content_type, message.content_encoding)
    if problem:
        return Verdict(Reason.UNDECODABLE, problem)
    if not message.body:
        return Verdict(Reason.UNDECODABLE, "empty body (valid: a JSON document)")
    try:
        body = message.decode()  # cached on the message: Celery's request reads it from there
    except ContentDisallowed as exc:
        return Verdict(Reason.CONTENT_REFUSED, f"content refused: {exc}", exc)
    except Exception as exc:  # noqa: BLE001 - kombu wraps the decoder's errors in DecodeError
        return Verdict(Reason.UNDECODABLE, f"body could not be decoded: {exc}", exc)
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict):
        return Verdict(Reason.INVALID_MESSAGE, f"headers must be a table/object, got {type(headers).__name__}")
    problem = _task_message_problem(headers, body, tasks)
    return Verdict(Reason.INVALID_MESSAGE, problem) if problem else None


def _task_message_problem(headers: dict, body: Any, tasks: dict) -> str | None:
    if "task" in headers:  # protocol 2
        problem = task_messages.header_problem(headers) or task_messages.body_problem(body)
        if problem:
            return problem
        name, (args, kwargs, _) = headers["task"], body
    elif isinstance(body, dict) and "task" in body:  # protocol 1 (old Celery, some other languages)
        problem = task_messages.protocol1_problem(body, headers)
        if problem:
            return problem
        name, args, kwargs = body["task"], body.get("args", ()), body.get("kwargs", {})
    else:
        return "not a Celery task message (no 'task' header or field)"
    task = tasks.get(name)
    if task is None:
        return None  # Celery's unknown-task path names it
    return task_messages.signature_problem(name, compat.argument_checker(task), args, kwargs)


def _shown_exception(exc: BaseException) -> str:
    """``repr(exc)``, even for an exception whose repr fails (one carrying the message's own
    deeply nested values, say)."""
    try:
        return repr(exc)
    except Exception:  # noqa: BLE001 - RecursionError and the like
        return f"{type(exc).__name__} (its text could not be shown)"


def _protocol1_body(message: Any) -> dict:
    """The decoded body of a protocol-1 message (already decoded and cached by then), else {}."""
    try:
        body = message.decode()
    except Exception:  # noqa: BLE001 - not decodable: no protocol-1 fields to read
        return {}
    return body if isinstance(body, dict) else {}


class Consumer(CeleryConsumer):
    """Celery's consumer, dead-lettering what it would drop, ack-and-forget, run wrongly or choke on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        decompression.install()  # a compressed body inflates in this process, as it arrives
        # Before the first connection: every Redis channel this worker opens checks what it pops.
        compat.guard_redis_items(functools.partial(redis_items.guarded, loads=compat.redis_item_loads,
                                                   body_codecs=compat.redis_body_codecs()))
        self._accepted_content = set(prepare_accept_content(self.app.conf.accept_content))
        compat.guard_pool_submission(self.controller, self, on_refused=self._refused_by_pool,
                                     passes_through=self._is_lost_connection)

    def _is_lost_connection(self, exc: BaseException) -> bool:
        # kombu's Redis transport counts KeyError among its connection errors: a missing key in a
        # message must not pass for a lost connection (that restarts the consumer and redelivers
        # the same message, forever).
        return isinstance(exc, tuple(self.connection_errors or ())) and not isinstance(exc, _MESSAGE_FAULTS)

    #: metrics.deliveries_seen() as the message being handled reached Celery (None outside of it):
    #: whether a request made from it counted its delivery already
    _deliveries_before: int | None = None

    def _refused_by_pool(self, request: Any, exc: BaseException) -> None:
        # A request was made: it counted its delivery (taskherd's Request, or Celery's task_received),
        # unless it was still to ask revoked() — then it counts it now (once: its own check).
        count_own = getattr(request, "_record_delivery_metric", None)
        if callable(count_own):
            count_own()
        self._dead_letter_message(request.message, Verdict(
            Reason.INVALID_MESSAGE, f"the task could not be handed to the pool: {_shown_exception(exc)}", exc),
            delivery_counted=True)

    def on_decode_error(self, message, exc):
        reason = Reason.CONTENT_REFUSED if isinstance(exc, ContentDisallowed) else Reason.UNDECODABLE
        compression = _headers_of(message).get("compression")
        body = f"body (compression {compression!r})" if compression else "body"
        self._dead_letter_message(message, Verdict(reason, f"{body} could not be decoded: {exc}", exc))

    def on_unknown_message(self, body, message):
        self._dead_letter_message(message, Verdict(Reason.INVALID_MESSAGE,
                                                   "not a Celery task message (no 'task' header or field)"))

    def on_unknown_task(self, body, message, exc):
        name = _headers_of(message).get("task") or _protocol1_body(message).get("task")
        self._dead_letter_message(message, Verdict(Reason.UNKNOWN_TASK,
                                                   f"no task named {name!r} is registered on this worker", exc))

    def on_invalid_task(self, body, message, exc):
        if isinstance(exc, ContentDisallowed):
            verdict = Verdict(Reason.CONTENT_REFUSED,
                              f"content type {message.content_type!r} refused (JSON only): {exc}", exc)
        else:
            verdict = Verdict(Reason.INVALID_MESSAGE, f"invalid task message: {exc}", exc)
        self._dead_letter_message(message, verdict)

    def create_task_handler(self, promise=promise):
        handle = super().create_task_handler(promise)
        # Looked up once: app.tasks is a cached property, a Python-level descriptor call per message.
        # The registry is the same dict for the worker's life (tasks registered later land in it).
        accepted, tasks = self._accepted_content, self.app.tasks

        def on_task_received(message):
            verdict = verdict_on(message, accepted=accepted, tasks=tasks)
            if verdict:
                return self._dead_letter_message(message, verdict)
            self._deliveries_before = metrics.deliveries_seen()
            try:
                return handle(message)
            except Exception as exc:  # what the checks did not foresee: dead-letter, keep consuming
                if self._is_lost_connection(exc):
                    raise  # the connection is gone: Celery reconnects and the broker redelivers
                self._dead_letter_message(message, Verdict(
                    Reason.INVALID_MESSAGE, f"message could not be turned into a task: {_shown_exception(exc)}",
                    exc))
            finally:
                self._deliveries_before = None

        return on_task_received

    def _delivery_counted(self) -> bool:
        """Whether a request made from the message being handled counted its delivery already
        (Celery calls on_unknown_task, on_invalid_task… before or after making one)."""
        before = self._deliveries_before
        return before is not None and metrics.deliveries_seen() != before

    def _dead_letter_message(self, message: Any, verdict: Verdict, *, delivery_counted: bool | None = None) -> None:
        """Dead-letters a message that became no task (or none the pool took), and counts its one
        outcome — ``dead_lettered``; ``rejected`` when RabbitMQ's native dead-lettering gets it
        instead; none when it goes back to its queue — with its delivery unless a request made
        from it counted that (`delivery_counted`; None: found out, see :meth:`_delivery_counted`).
        Its ``task`` label names a registered task or ``unknown``, never a name from the wire."""
        if delivery_counted is None:
            delivery_counted = self._delivery_counted()
        profile = get_profile(self.app)
        delivery_info = getattr(message, "delivery_info", None) or {}
        queue = queue_of(self.app, profile, delivery_info)
        if unreadable_item_problem(message) is not None:
            # The body is the popped item itself: it had no headers or content type of its own.
            headers: dict = {}
            raw = raw_body_fields(message.body, None, None)
        else:
            headers = _headers_of(message)
            body = message.body if isinstance(message.body, (bytes, str, type(None))) else repr(message.body)
            raw = raw_body_fields(body, message.content_type, message.content_encoding)
        task, task_id = headers.get("task"), headers.get("id")
        if task is None and verdict.reason in (Reason.INVALID_MESSAGE, Reason.UNKNOWN_TASK):
            # Decoded (JSON, accepted) by now: a protocol-1 body names its task and id itself.
            protocol1 = _protocol1_body(message)
            task, task_id = protocol1.get("task"), protocol1.get("id")
        envelope = Envelope(
            reason=verdict.reason, detail=verdict.detail, queue=queue,
            task=task if isinstance(task, str) else None,
            task_id=task_id if isinstance(task_id, str) else None,
            headers=json_safe(headers) if isinstance(getattr(message, "headers", None), dict)
            else {"unparseable_headers": repr(getattr(message, "headers", None))},
            attempts=0, hostname=self.hostname, exchange=delivery_info.get("exchange"),
            routing_key=delivery_info.get("routing_key"),
            **(exception_fields(verdict.exc) if verdict.exc is not None else {}),
            **raw,
        )
        envelope.first_failure_at = envelope.last_failure_at = envelope.dead_lettered_at
        try:
            publish_envelope(envelope, broker_url=profile.broker_url,
                             dead_letter_queue=profile.dead_letter_queue_for(queue),
                             transport_options=dict(self.app.conf.broker_transport_options or {}),
                             queue_type=profile.queue_type)
        except Exception:
            # Not in our DLQ: on RabbitMQ reject into native dead-lettering (the queue's DLX);
            # on Redis a reject would drop it, so it goes back to the queue.
            logger.exception("taskherd: could not dead-letter a %s message from %s", verdict.reason, queue)
            message.reject_log_error(logger, self.connection_errors, requeue=not profile.broker_is_amqp)
            if profile.broker_is_amqp:  # rejected for good (into the queue's DLX, if it has one)
                metrics.message_outcome(metrics.task_label(task, self.app.tasks), "rejected",
                                        count_delivery=not delivery_counted)
            # On Redis it goes back to its queue: no outcome yet; a request made from it counted a
            # delivery (one without an outcome), otherwise nothing is counted until it is handled.
            return
        logger.error("taskherd: %s message (task=%r id=%r) from %s dead-lettered to %s: %s", verdict.reason,
                     envelope.task, envelope.task_id, queue, profile.dead_letter_queue_for(queue), verdict.detail)
        metrics.message_outcome(metrics.task_label(task, self.app.tasks), "dead_lettered",
                                count_delivery=not delivery_counted)
        message.ack_log_error(logger, self.connection_errors)


class DeclareDeadLetterQueues(bootsteps.StartStopStep):
    """On each (re)connection to RabbitMQ, declare the DLQ of every profiled work queue."""

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, c):
        profile: Profile = get_profile(c.app)
        if not profile.broker_is_amqp:
            return
        for queue in profile.queues:
            name = profile.dead_letter_queue_for(queue)
            try:
                # A channel each: a refused declaration closes its channel, not the connection.
                with c.connection.channel() as channel:
                    dead_letter_queue_declaration(name, queue_type=profile.queue_type)(channel).declare()
            except c.connection.channel_errors as exc:
                # Keep consuming: the work can still succeed, and a failure that needs the DLQ is
                # requeued (not lost) until the DLQ is fixed. Loud, so that someone fixes it.
                logger.critical("taskherd: cannot declare dead-letter queue %s: %s", name, exc)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BadMessages(Component):
    """Installs the dead-lettering :class:`Consumer` and the DLQ declaration step."""

    def install(self, app: Any, profile: Profile) -> None:
        app.conf.worker_consumer = f"{Consumer.__module__}:{Consumer.__qualname__}"
        app.steps["consumer"].add(DeclareDeadLetterQueues)
