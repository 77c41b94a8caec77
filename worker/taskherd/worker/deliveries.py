"""Counting deliveries of a message, so one that kills its worker every time is bounded.

With ``task_reject_on_worker_lost`` a task whose process dies (OOM, segfault, ``os._exit``) is
requeued — and, if it kills the process every time, forever. Before running a task we INCR a
Redis counter keyed by (task id, retry number, redrive number); the key lives ``ttl`` seconds and
is deleted when the task returns. A delivery whose count exceeds ``max_deliveries`` is not run:
the caller dead-letters it. Each retry is a new message (``Task.retry`` publishes anew), hence
the retry number in the key; a redrive starts a fresh budget, hence the redrive number.

If Redis is unreachable the count is unknown and the task runs (fail open): blocking every task
because the counter is down would be worse than an unbounded redelivery loop, which the quorum
queue's ``x-delivery-limit`` still bounds on RabbitMQ.
"""
from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

KEY_PREFIX = "taskherd:deliveries"

_clients: dict[tuple[int, str], Any] = {}


def delivery_key(task_id: str, retries: int, redrives: int = 0) -> str:
    return f"{KEY_PREFIX}:{task_id}:{retries}:{redrives}"


def exceeds(redeliveries: int | None, max_deliveries: int) -> bool:
    """True when this delivery (number ``redeliveries + 1``) is past the budget: ``max_deliveries``
    runs were already started and none finished."""
    return redeliveries is not None and redeliveries + 1 > max_deliveries


def _client(url: str):
    # One client per process: prefork children must not share the parent's sockets.
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
        pipe = _client(url).pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, max(1, int(ttl)))
        count, _ = pipe.execute()
        return int(count)
    except Exception as exc:  # noqa: BLE001 - fail open, see the module docstring
        logger.warning("taskherd: delivery counter unavailable (%s); running %s uncounted", exc, key)
        return None


def forget(url: str | None, key: str) -> None:
    """The task returned (success, failure or retry): its counter is no longer needed."""
    if not url:
        return
    try:
        _client(url).delete(key)
    except Exception as exc:  # noqa: BLE001 - the TTL cleans up
        logger.debug("taskherd: could not delete %s: %s", key, exc)
