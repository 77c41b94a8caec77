"""Counting the deliveries of a message, so one that kills its worker every time is bounded.

With ``task_reject_on_worker_lost`` a task whose process dies (OOM, segfault, ``os._exit``) is
returned to its queue — and, if it kills the process every time, forever. A delivery whose
earlier deliveries number ``max_deliveries`` or more (each returned without an outcome) is not
run: the task dead-letters it. Each retry is a new message (``Task.retry`` publishes anew) and a
redrive starts a fresh budget, so a count belongs to one (task id, retry number, redrive number).

Only a redelivery can follow a death, and the count travels with the message or comes from the
broker, so a first delivery — nearly all of them — costs nothing. Where the count comes from
(:func:`count`, first that applies):

1. The header ``taskherd_redeliveries`` ("<task id>:<retries>:<redrives>:<n>", see
   :func:`returned_headers`), written by taskherd's own paths that return a message:
   - Redis: the FastRecovery component's tracking QoS, on every return — its held copy (a dead
     worker's messages, restored by a live one), kombu's restore of the ``unacked`` entry (the
     visibility timeout, a requeue after a killed pool child, a worker's shutdown);
   - RabbitMQ classic queues: :func:`strategy`, in the worker's main process, publishes a
     redelivered message again with the count + 1 (confirmed) and acknowledges the original, so the
     copy that runs carries its count. A header copied into another attempt (a retry, a redrive)
     names another attempt and is ignored.
2. RabbitMQ quorum queues: the broker's ``x-delivery-count`` on a redelivery.
3. A Redis counter (``delivery_counter_url``), INCR per redelivery: Redis brokers without
   FastRecovery, and RabbitMQ classic queues when one is configured (exact, no republish, one
   round trip per redelivery).
4. Otherwise the count is unknown and the task runs uncounted (fail open, logged): blocking every
   task because the counter is down would be worse than an unbounded loop, which a quorum
   queue's ``x-delivery-limit`` still bounds.

Every return counts, as RabbitMQ's own ``x-delivery-count`` does: a worker death, a message
requeued unrun at a worker's shutdown or after a connection loss — except, on RabbitMQ, a message
whose ETA (a countdown, a retry's backoff) is still ahead when it comes back: Celery holds such a
message unacknowledged until its ETA, and no delivery of it can have run yet, so its returns (each
restart, drain or scale-down of the worker holding it) are no deaths. :func:`strategy` replaces it
by a fresh copy (its headers as they were; confirmed, then the original acknowledged), which also
resets a quorum queue's ``x-delivery-count`` and keeps its ``x-delivery-limit`` from dead-lettering
a task that never ran. (On Redis an ETA message waits in the delay set, held by no worker.)

The republish of (1) on RabbitMQ classic queues is safe but not free of duplicates: a worker that
dies after the copy is confirmed and before the original is acknowledged leaves both in the queue,
and the task runs twice (the idempotency guard's case), each copy still bounded.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .deadletter import REDRIVES_HEADER

logger = logging.getLogger(__name__)

KEY_PREFIX = "taskherd:deliveries"
#: The count carried by a returned message (module docstring, 1).
HEADER = "taskherd_redeliveries"
#: RabbitMQ quorum queues' own count of returns.
QUORUM_HEADER = "x-delivery-count"

_clients: dict[tuple[int, str], Any] = {}


def delivery_key(task_id: str, retries: int, redrives: int = 0) -> str:
    return f"{KEY_PREFIX}:{task_id}:{retries}:{redrives}"


def exceeds(redeliveries: int | None, max_deliveries: int) -> bool:
    """True when this delivery (number ``redeliveries + 1``) is past the budget: ``max_deliveries``
    runs were already started and none finished."""
    return redeliveries is not None and redeliveries + 1 > max_deliveries


# -- the count carried in the message ----------------------------------------------------------
def _whole(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def attempt(task_id: Any, retries: Any, redrives: Any) -> str:
    """Which attempt a count belongs to: task id, retry number, redrive number."""
    return f"{task_id}:{_whole(retries)}:{_whole(redrives)}"


def carried(value: Any, of_attempt: str) -> int | None:
    """The count in a ``taskherd_redeliveries`` header value when it belongs to ``of_attempt``."""
    if not isinstance(value, str):
        return None
    scope, _, count = value.rpartition(":")
    if scope != of_attempt or not count.isdigit():
        return None
    return int(count)


def returned_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Protocol-2 message ``headers`` as they must be when the message returns to its queue once
    more: the count of this attempt + 1. Pure: the Redis QoS and the republish both use it."""
    scope = attempt(headers.get("id"), headers.get("retries"), headers.get(REDRIVES_HEADER))
    previous = carried(headers.get(HEADER), scope) or 0
    return {**headers, HEADER: f"{scope}:{previous + 1}"}


# -- the count of a delivery, in the pool child --------------------------------------------------
@dataclass(frozen=True)
class Count:
    """How many times this attempt was delivered before and returned without an outcome."""

    #: None: unknown (the task runs uncounted)
    redeliveries: int | None
    #: where it came from: first delivery, header, x-delivery-count, counter, unknown
    source: str
    #: the Redis counter to delete once the delivery has an outcome (counter source only)
    counter: tuple[str, str] | None = None

    def forget(self) -> None:
        """The delivery has an outcome (success, failure, retry): its counter is no longer needed."""
        if self.counter is not None:
            forget(*self.counter)


#: A first delivery's count: nearly every delivery, one object for all.
FIRST_DELIVERY = Count(0, "first delivery")


def count(*, task_id: str, retries: int, headers: Mapping[str, Any] | None, redelivered: bool,
          queue_type: str, counter_url: str | None, counter_ttl: float) -> Count:
    """The count of this delivery (module docstring); ``headers`` are the message's custom headers."""
    headers = headers or {}
    if not redelivered and HEADER not in headers:
        return FIRST_DELIVERY  # no count to read: nothing returned this message before
    scope = attempt(task_id, retries, headers.get(REDRIVES_HEADER))
    from_header = carried(headers.get(HEADER), scope)
    if from_header is not None:
        return Count(from_header, "header")
    if not redelivered:
        return FIRST_DELIVERY
    if queue_type == "quorum" and headers.get(QUORUM_HEADER) is not None:
        return Count(_whole(headers.get(QUORUM_HEADER)), QUORUM_HEADER)
    if counter_url:
        key = delivery_key(task_id, _whole(retries), _whole(headers.get(REDRIVES_HEADER)))
        return Count(record_delivery(counter_url, key, ttl=counter_ttl), "counter", (counter_url, key))
    logger.warning("taskherd: %s was redelivered and nothing counts its deliveries here (no count header, no "
                   "x-delivery-count, no delivery_counter_url); running it uncounted", scope)
    return Count(None, "unknown")


# -- RabbitMQ classic queues: the count is carried by a copy, published by the main process -----
def recounts(profile: Any) -> bool:
    """Whether redelivered messages must be published again with their count (module doc, 1)."""
    return profile.broker_is_amqp and profile.queue_type == "classic" and not profile.delivery_counter_url


#: How far ahead a returned message's ETA must be for it to count as never run: workers' clocks
#: differ by a little (NTP), and one whose clock runs ahead may have started it a little early.
UNRUN_ETA_MARGIN_SECONDS = 5.0


def republish(message: Any, profile: Any, app: Any, headers: Mapping[str, Any]) -> None:
    """Publish ``message`` again with ``headers`` and return once the broker has the copy."""
    from .publishing import message_properties, publish

    info = message.delivery_info or {}
    publish(message.body, broker_url=profile.broker_url, exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or "", transport_options=dict(app.conf.broker_transport_options or {}),
            headers=dict(headers), content_type=message.content_type,
            content_encoding=message.content_encoding, **message_properties(message))


def unrun(headers: Any, *, now: float, default_timezone: Any) -> bool:
    """Whether a returned message cannot have run: its ETA is still ahead (module docstring)."""
    from .delayed import due_time

    eta = due_time(headers, default_timezone=default_timezone)
    return eta is not None and eta > now + UNRUN_ETA_MARGIN_SECONDS


def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable:
    """The Task class's ``Strategy``: taskherd.worker.delayed's (ETA messages on Redis), and on
    RabbitMQ a redelivered message replaced by a copy: carrying its count + 1 on classic queues
    (without a Redis counter), its headers unchanged when its ETA is still ahead (never run)."""
    import time

    from .delayed import strategy as parking_strategy
    from .profile import get_profile

    handle = parking_strategy(task, app, consumer, **kwargs)
    profile = get_profile(app)
    if not profile.broker_is_amqp:
        return handle
    with_count = recounts(profile)
    connection_errors = consumer.connection_errors
    timezone = app.timezone

    def task_message_handler(message, body, ack, reject, callbacks, **options):
        if not (message.delivery_info or {}).get("redelivered"):
            return handle(message, body, ack, reject, callbacks, **options)
        headers = message.headers or {}
        if unrun(headers, now=time.time(), default_timezone=timezone):
            copy, doing = {k: v for k, v in headers.items() if k != QUORUM_HEADER}, "uncounted (its ETA is ahead)"
        elif with_count:
            copy, doing = returned_headers(headers), "with its count"
        else:
            return handle(message, body, ack, reject, callbacks, **options)
        try:
            republish(message, profile, app, copy)
        except Exception as exc:  # noqa: BLE001 - run it as it is rather than hold or lose it
            logger.warning("taskherd: could not publish redelivered %s[%s] again %s (%s); handling it as it came",
                           task.name, headers.get("id"), doing, exc)
            return handle(message, body, ack, reject, callbacks, **options)
        ack(logger, connection_errors)
        return None

    return task_message_handler


# -- the Redis counter -------------------------------------------------------------------------
def process_client(url: str):
    """This process's Redis client for ``url`` (5 s timeouts): prefork children must not share the
    parent's sockets."""
    key = (os.getpid(), url)
    client = _clients.get(key)
    if client is None:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        _clients[key] = client
    return client


def record_delivery(url: str | None, key: str, *, ttl: float) -> int | None:
    """INCR the counter for this delivery; its new value, or None when it cannot be counted."""
    if not url:
        return None
    try:
        pipe = process_client(url).pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, max(1, int(ttl)))
        count_now, _ = pipe.execute()
        return int(count_now)
    except Exception as exc:  # noqa: BLE001 - fail open, see the module docstring
        logger.warning("taskherd: delivery counter unavailable (%s); running %s uncounted", exc, key)
        return None


def forget(url: str | None, key: str) -> None:
    """Deletes a delivery's counter once the delivery has an outcome."""
    if not url:
        return
    try:
        process_client(url).delete(key)
    except Exception as exc:  # noqa: BLE001 - the TTL cleans up
        logger.debug("taskherd: could not delete %s: %s", key, exc)
