"""Queue inspection shared by the operator and `taskherd exporter`; importable without Celery.

``inspect_queues(broker_url, queues)`` returns one :class:`QueueStats` per queue name: ready and
unacknowledged counts, consumers, the age of the oldest ready message and of the oldest unacked
delivery. Redis is read directly (lists, the ``unacked`` hash and ``unacked_index`` sorted set of
kombu's transport); RabbitMQ through the management HTTP API. docs/queues.md explains each figure.
"""
from __future__ import annotations

from urllib.parse import urlsplit

from taskherd.contract import PY_AMQP_SCHEMES, REDIS_PY_SCHEMES

from .stats import BrokerUnreachable, QueueStats

__all__ = ["BrokerUnreachable", "QueueStats", "inspect_queues"]

def inspect_queues(broker_url: str, queues: list[str], *, management_url: str | None = None,
                   global_keyprefix: str = "", now: float | None = None,
                   visibility_timeout: float = 3600.0) -> dict[str, QueueStats]:
    """Inspects ``queues`` on the broker at ``broker_url``; a DLQ is inspected like any queue.

    ``global_keyprefix`` and ``visibility_timeout`` apply to Redis (kombu transport options of the
    same names); ``management_url`` to RabbitMQ (derived from the AMQP URL when None).
    """
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
