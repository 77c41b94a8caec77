"""Queue inspection shared by the operator and `taskherd exporter`; importable without Celery.

``inspect_queues(broker_url, queues)`` returns one :class:`QueueStats` per queue name: ready and
unacknowledged counts, consumers, the age of the oldest ready message and of the oldest unacked
delivery. Redis is read directly (lists, the ``unacked`` hash and ``unacked_index`` sorted set of
kombu's transport); RabbitMQ through the management HTTP API. docs/queues.md explains each figure.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from taskherd.contract import PY_AMQP_SCHEMES, REDIS_PY_SCHEMES, failover_urls

from .stats import BrokerUnreachable, QueueStats

__all__ = ["BrokerUnreachable", "QueueStats", "first_answer", "inspect_queues"]


def first_answer(urls, call, start=0):
    """``(index, call(url))`` for the first URL of a failover list that answers, tried from
    ``start`` round the list as kombu's connection tries them: a pool's workers are on whichever
    answers, and every node of a RabbitMQ cluster shows its queues. Reading the list as one URL
    read 'redis://a/1;redis://b/1' as database 0 of host a (redis-py) and 'amqp://a/shop;…' as the
    vhost 'shop;…'. The first error when none answers."""
    errors = []
    for index in [*range(start, len(urls)), *range(start)]:
        try:
            return index, call(urls[index])
        except Exception as exc:  # noqa: BLE001 - unreachable or refusing: the next URL may answer
            errors.append(exc)
    raise errors[0]

def inspect_queues(broker_url: str, queues: list[str], *, management_url: str | None = None,
                   global_keyprefix: str = "", now: float | None = None,
                   visibility_timeout: float = 3600.0) -> dict[str, QueueStats]:
    """Inspects ``queues`` on the broker at ``broker_url``; a DLQ is inspected like any queue.

    ``global_keyprefix`` and ``visibility_timeout`` apply to Redis (kombu transport options of the
    same names); ``management_url`` to RabbitMQ (derived from the AMQP URL when None). A ';'-joined
    failover list is inspected at its first URL that answers (:func:`first_answer`).
    """
    urls = failover_urls(broker_url)
    if len(urls) > 1:
        return first_answer(urls, lambda url: inspect_queues(
            url, queues, management_url=management_url, global_keyprefix=global_keyprefix, now=now,
            visibility_timeout=visibility_timeout))[1]
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
