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
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from taskherd.contract import shown

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


# -- reading the counts and times taskherd keeps in a message's headers -------------------------
# Any producer can put anything in a header, and some of these are read in the worker's main
# process (the Redis QoS counts a return as it takes the message), where an exception ends the
# worker — and every worker restarted after it, since the message comes back. So every header
# taskherd reads a number from is read here, and anything unreadable is None, never an exception.

#: Digits a count may have: 18 hold any count a broker or taskherd writes (AMQP's widest integer
#: is 64 bits); more is no count (and int() refuses more than 4300 digits).
MAX_COUNT_DIGITS = 18
_COUNT_LIMIT = 10 ** MAX_COUNT_DIGITS
#: The latest epoch second a timestamp may be: the end of year 9999, the last datetime can show.
LATEST_TIMESTAMP = 253402300799.0


def header_count(value: Any) -> int | None:
    """A count read from a header (``retries``, ``taskherd_redrives``, the count in
    ``taskherd_redeliveries``, ``x-delivery-count``): an integer >= 0, or None when ``value`` is
    none — a bool, a float that is not whole (NaN, Infinity), a negative number, more than
    MAX_COUNT_DIGITS digits, a string of anything but ASCII digits ('²' and '٣' are digits to
    str.isdigit(), and int() refuses the first), a dict, a list, None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < _COUNT_LIMIT else None
    if isinstance(value, float):
        whole = math.isfinite(value) and value.is_integer() and 0 <= value < _COUNT_LIMIT
        return int(value) if whole else None
    if isinstance(value, str):
        digits = 0 < len(value) <= MAX_COUNT_DIGITS and value.isascii() and value.isdecimal()
        return int(value) if digits else None
    return None


def header_timestamp(value: Any) -> float | None:
    """Epoch seconds read from a header (``taskherd_first_failure_at``, ``taskherd_published_at``,
    both written as numbers): a finite number from 0 to the end of year 9999, or None when
    ``value`` is none (a string, a bool, NaN, Infinity, a dict, None …)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > LATEST_TIMESTAMP:
        return None  # before float(): a 5000-digit int would overflow it
    seconds = float(value)
    return seconds if math.isfinite(seconds) and 0 <= seconds <= LATEST_TIMESTAMP else None


def _count_or_zero(value: Any) -> int:
    """A retry or redrive number of an attempt: an unreadable one counts as 0 (see :func:`attempt`)."""
    return header_count(value) or 0


# -- the count carried in the message ----------------------------------------------------------
def attempt(task_id: Any, retries: Any, redrives: Any) -> str:
    """Which attempt a count belongs to: task id, retry number, redrive number.

    An unreadable retry or redrive number reads as 0. This keeps the bound exact: the main process
    that writes a count (:func:`returned_headers`) and the child that reads it (:func:`count`) both
    scope it here, from the same headers, so a message returned N times is counted N whatever
    those headers hold. (A ``retries`` that is no count never reaches the pool: the message
    checks dead-letter it as invalid-message, as they do an ``id`` that is not a string: that one
    is shown, since str() of a list nested a thousand deep raises.)"""
    task = task_id if isinstance(task_id, str) else shown(task_id)
    return f"{task}:{_count_or_zero(retries)}:{_count_or_zero(redrives)}"


def carried(value: Any, of_attempt: str) -> int | None:
    """The count in a ``taskherd_redeliveries`` header value when it belongs to ``of_attempt``.

    None also when the count is unreadable: taskherd writes only well-formed counts, so a message
    carrying another was never returned by taskherd, and its first return writes a good count."""
    if not isinstance(value, str):
        return None
    scope, _, count = value.rpartition(":")
    return header_count(count) if scope == of_attempt else None


def _log_unreadable_counts(headers: Mapping[str, Any], scope: str) -> None:
    """One warning per delivery for a count header that cannot be read (how each is read instead:
    :func:`attempt`, :func:`carried`)."""
    redrives = headers.get(REDRIVES_HEADER)
    if redrives is not None and header_count(redrives) is None:
        logger.warning("taskherd: %s: header %s=%s is not a count (valid: an integer >= 0); read as 0",
                       scope, REDRIVES_HEADER, shown(redrives))
    value = headers.get(HEADER)
    if value is not None and carried(value, scope) is None and (
            not isinstance(value, str) or value.rpartition(":")[0] == scope):
        logger.warning("taskherd: %s: header %s=%s is not a count of its deliveries (valid: "
                       "'<task id>:<retries>:<redrives>:<count>', count an integer >= 0); read as absent",
                       scope, HEADER, shown(value))


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
    _log_unreadable_counts(headers, scope)
    if not redelivered:
        return FIRST_DELIVERY
    quorum_count = header_count(headers.get(QUORUM_HEADER))
    if queue_type == "quorum" and quorum_count is not None:
        return Count(quorum_count, QUORUM_HEADER)
    if counter_url:
        key = delivery_key(task_id, _count_or_zero(retries), _count_or_zero(headers.get(REDRIVES_HEADER)))
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
