"""What the operator assumes about the workers and the chart, in one place.

The ports, the dead-letter queue naming and the broker kind of a URL are shared with the worker
package and the chart; when a single contract module serves all three, these names become
imports from it and nothing else in the operator changes.
"""
from __future__ import annotations

from urllib.parse import urlsplit

#: the workers' Prometheus endpoint (`taskherd_tasks_in_flight`).
WORKER_METRICS_PORT = 9808
#: the operator's own /metrics.
OPERATOR_METRICS_PORT = 9809
#: a work queue `<q>` dead-letters to `<q>` + this suffix unless the WorkerPool lists its DLQs.
DEAD_LETTER_SUFFIX = ".dlq"
#: URL schemes of a Redis broker whose connection the operator keeps between polls.
REDIS_URL_SCHEMES = ("redis", "rediss")


def dead_letter_queue(queue: str) -> str:
    return queue + DEAD_LETTER_SUFFIX


def is_redis_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in REDIS_URL_SCHEMES
