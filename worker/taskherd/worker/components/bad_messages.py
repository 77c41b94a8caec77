"""The worker's consumer: a message it cannot run goes to the DLQ with the reason, never silently away.

Celery's own consumer logs and acks an undecodable message, and rejects (drops, on Redis) one
that names an unknown task or carries broken headers; an exception it did not foresee (a protocol-2
message without an ``id`` header, say) escapes into the event loop and restarts the connection,
redelivering the same message in a loop. This subclass, installed as ``worker_consumer`` by the BadMessages component, turns
each of those into a DLQ envelope — with the raw body base64-encoded, since it could not be
decoded or must not be (pickle is refused by ``accept_content`` before anything is unpickled) —
then acks the message, and goes on consuming.

It also declares each work queue's DLQ when the connection starts (RabbitMQ), so native
dead-lettering has somewhere to go before the first envelope is ever published.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from celery import bootsteps
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.exceptions import ContentDisallowed
from vine import promise

from taskherd.worker.deadletter import (Envelope, Reason, dead_letter_queue_declaration, exception_fields,
                                       json_safe, publish_envelope, raw_body_fields)
from taskherd.worker.profile import Profile, get_profile
from taskherd.worker.task import queue_of

from . import Component

logger = logging.getLogger(__name__)


def _headers_of(message: Any) -> dict:
    headers = getattr(message, "headers", None)
    return headers if isinstance(headers, dict) else {}


#: Exceptions that say "this message is malformed", whatever a transport files them under.
_MESSAGE_FAULTS = (LookupError, TypeError, ValueError, AttributeError, UnicodeError)

#: Protocol-2 headers every task message must carry, with their types.
_REQUIRED_HEADERS = {"id": str, "task": str}


def broken_headers(message: Any) -> str | None:
    """Why a protocol-2 task message's headers are unusable, or None if they look fine.

    Only messages that claim to be protocol 2 (a ``task`` header) are checked; anything else is
    left to Celery's decoding path (protocol 1, or not a task message at all).
    """
    headers = getattr(message, "headers", None)
    if not isinstance(headers, dict) or "task" not in headers:
        return None
    for name, kind in _REQUIRED_HEADERS.items():
        value = headers.get(name)
        if not isinstance(value, kind) or not value:
            return f"broken headers: {name!r} must be a non-empty {kind.__name__}, got {value!r}"
    for name in ("retries", "group_index"):
        if headers.get(name) is not None and not isinstance(headers.get(name), int):
            return f"broken headers: {name!r} must be an integer, got {headers.get(name)!r}"
    return None


class Consumer(CeleryConsumer):
    """Celery's consumer, dead-lettering what it would drop, ack-and-forget or choke on."""

    def on_decode_error(self, message, exc):
        reason = Reason.CONTENT_REFUSED if isinstance(exc, ContentDisallowed) else Reason.UNDECODABLE
        self._dead_letter_message(message, reason, f"body could not be decoded: {exc}", exc)

    def on_unknown_message(self, body, message):
        self._dead_letter_message(message, Reason.INVALID_MESSAGE,
                                  "not a Celery task message (no 'task' header or field)", None)

    def on_unknown_task(self, body, message, exc):
        name = _headers_of(message).get("task")
        self._dead_letter_message(message, Reason.UNKNOWN_TASK,
                                  f"no task named {name!r} is registered on this worker", exc)

    def on_invalid_task(self, body, message, exc):
        if isinstance(exc, ContentDisallowed):
            self._dead_letter_message(message, Reason.CONTENT_REFUSED,
                                      f"content type {message.content_type!r} refused (JSON only): {exc}", exc)
        else:
            self._dead_letter_message(message, Reason.INVALID_MESSAGE, f"invalid task message: {exc}", exc)

    def create_task_handler(self, promise=promise):
        handle = super().create_task_handler(promise)
        connection_errors = tuple(self.connection_errors or ())

        def on_task_received(message):
            problem = broken_headers(message)
            if problem:
                return self._dead_letter_message(message, Reason.INVALID_MESSAGE, problem, None)
            try:
                return handle(message)
            except Exception as exc:  # broken headers and the like: dead-letter, keep consuming
                # kombu's Redis transport counts KeyError among its connection errors: a missing
                # key in a message must not pass for a lost connection (that restarts the
                # consumer and redelivers the same message, forever).
                if isinstance(exc, connection_errors) and not isinstance(exc, _MESSAGE_FAULTS):
                    raise  # the connection is gone: Celery reconnects and the broker redelivers
                self._dead_letter_message(message, Reason.INVALID_MESSAGE,
                                          f"message could not be turned into a task: {exc!r}", exc)

        return on_task_received

    def _dead_letter_message(self, message: Any, reason: str, detail: str, exc: BaseException | None) -> None:
        profile = get_profile(self.app)
        headers = _headers_of(message)
        delivery_info = getattr(message, "delivery_info", None) or {}
        queue = queue_of(self.app, profile, delivery_info)
        task_id = headers.get("id")
        envelope = Envelope(
            reason=reason, detail=detail, queue=queue,
            task=headers.get("task") if isinstance(headers.get("task"), str) else None,
            task_id=task_id if isinstance(task_id, str) else None,
            headers=json_safe(headers) if isinstance(getattr(message, "headers", None), dict)
            else {"unparseable_headers": repr(getattr(message, "headers", None))},
            attempts=0, hostname=self.hostname, exchange=delivery_info.get("exchange"),
            routing_key=delivery_info.get("routing_key"),
            **(exception_fields(exc) if exc is not None else {}),
            **raw_body_fields(message.body, message.content_type, message.content_encoding),
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
            logger.exception("taskherd: could not dead-letter a %s message from %s", reason, queue)
            message.reject_log_error(logger, self.connection_errors, requeue=not profile.broker_is_amqp)
            return
        logger.error("taskherd: %s message (task=%r id=%r) from %s dead-lettered to %s: %s",
                     reason, envelope.task, envelope.task_id, queue, profile.dead_letter_queue_for(queue), detail)
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
