"""Queue inspection shared by the operator and `taskherd exporter`; importable without Celery.

``inspect_queues(broker_url, queues)`` returns one :class:`QueueStats` per queue name: ready and
unacknowledged counts, consumers, the age of the oldest ready message and of the oldest unacked
delivery. Redis is read directly (lists, the ``unacked`` hash and ``unacked_index`` sorted set of
kombu's transport); RabbitMQ through the management HTTP API. docs/queues.md explains each figure.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit

from taskherd.contract import PY_AMQP_SCHEMES, REDIS_PY_SCHEMES, failover_urls

from .stats import BrokerRefused, BrokerUnreachable, InspectionError, QueueStats, QueuesUnreadable

__all__ = ["BrokerRefused", "BrokerUnreachable", "FailoverMemory", "InspectionError", "QueueStats",
           "QueuesUnreadable", "first_answer", "inspect_queues"]


def first_answer(urls, call, start=0):
    """``(index, call(url))`` for the first URL of a failover list that answers, tried from
    ``start`` round the list as kombu's connection tries them: a pool's workers are on whichever
    answers, and every node of a RabbitMQ cluster shows its queues. Reading the list as one URL
    read 'redis://a/1;redis://b/1' as database 0 of host a (redis-py) and 'amqp://a/shop;…' as the
    vhost 'shop;…'. The first error when none answers.

    A URL whose broker answers with an error (:class:`BrokerRefused`: a key of the wrong type, an
    ACL refusal, some queues unreadable) is the one that answered: kombu is connected to it, and
    the next URL's broker (another Redis) holds other queues; its error is raised at once, with
    ``answered_index`` set."""
    errors = []
    for index in [*range(start, len(urls)), *range(start)]:
        try:
            return index, call(urls[index])
        except BrokerRefused as exc:
            exc.answered_index = index
            raise
        except Exception as exc:  # noqa: BLE001 - unreachable or refusing: the next URL may answer
            errors.append(exc)
    raise errors[0]


class FailoverMemory:
    """Of each failover list, the URL that answered last: the next :meth:`call` starts there, as
    kombu's connection stays with the broker it reached. Without it every call starts from the
    first URL, and a first broker that accepts connections but never answers costs each call the
    client's whole socket timeout. Thread-safe; keeps at most ``max_kept`` lists (only those
    failed over: a rotated URL leaves its old list behind). The operator's BrokerObserver and
    `taskherd exporter` keep one each."""

    def __init__(self, *, max_kept: int = 64) -> None:
        self.max_kept = max_kept
        self._answering: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def start(self, urls: Sequence[str]) -> int:
        """Where the next call of ``urls`` starts: the index of the URL that answered last."""
        with self._lock:
            return self._answering.get(tuple(urls), 0)

    def call(self, urls: Sequence[str], call: Callable[[str], Any]) -> Any:
        """``call(url)`` at the first URL that answers (:func:`first_answer`), from the one that
        answered last."""
        urls = tuple(urls)
        try:
            index, answer = first_answer(urls, call, self.start(urls))
        except BrokerRefused as exc:  # it answered, with an error: it is the one to start from
            self._remember(urls, exc.answered_index)
            raise
        self._remember(urls, index)
        return answer

    def _remember(self, urls: tuple[str, ...], index: int) -> None:
        with self._lock:
            self._answering.pop(urls, None)
            if index:  # kept only while failed over
                if len(self._answering) >= self.max_kept:
                    self._answering.pop(next(iter(self._answering)))
                self._answering[urls] = index

def inspect_queues(broker_url: str, queues: list[str], *, management_url: str | None = None,
                   global_keyprefix: str = "", now: float | None = None,
                   visibility_timeout: float = 3600.0,
                   failover: FailoverMemory | None = None) -> dict[str, QueueStats]:
    """Inspects ``queues`` on the broker at ``broker_url``; a DLQ is inspected like any queue.

    ``global_keyprefix`` and ``visibility_timeout`` apply to Redis (kombu transport options of the
    same names); ``management_url`` to RabbitMQ (derived from the AMQP URL when None). A ';'-joined
    failover list is inspected at its first URL that answers (:func:`first_answer`), starting from
    the one that answered last when ``failover`` remembers it (a caller that inspects often).

    Errors (taskherd.queues.stats): :class:`BrokerUnreachable`; :class:`BrokerRefused`, the broker
    answered with an error; :class:`QueuesUnreadable` (a BrokerRefused), some queues could not be
    read (a key of the wrong type, a management API 5xx for that queue): it carries why, per
    queue, and the other queues' figures.
    """
    urls = failover_urls(broker_url)
    if len(urls) > 1:
        def inspect_one(url: str) -> dict[str, QueueStats]:
            return inspect_queues(url, queues, management_url=management_url, global_keyprefix=global_keyprefix,
                                  now=now, visibility_timeout=visibility_timeout)
        if failover is not None:
            return failover.call(urls, inspect_one)
        return first_answer(urls, inspect_one)[1]
    scheme = urlsplit(broker_url).scheme.lower()
    if scheme in REDIS_PY_SCHEMES:
        from .redis import inspect_redis

        return inspect_redis(broker_url, queues, global_keyprefix=global_keyprefix, now=now,
                             visibility_timeout=visibility_timeout)
    if scheme in PY_AMQP_SCHEMES:
        from .rabbitmq import inspect_rabbitmq

        return inspect_rabbitmq(broker_url, queues, management_url=management_url, now=now)
    raise ValueError(f"broker_url scheme {scheme!r} is not supported for inspection: "
                     f"use one of {', '.join(REDIS_PY_SCHEMES + PY_AMQP_SCHEMES)}")
