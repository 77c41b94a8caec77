"""`taskherd exporter`: queue depth, age, consumers and DLQ depth as Prometheus metrics.

Polls the broker every ``--interval`` seconds with taskherd.queues (the same inspection the
operator uses) and serves the last poll on ``--port``. A failed poll exports no queue figures
(stale ones would look healthy) and sets ``taskherd_exporter_poll_success`` to 0.

Metrics (label ``queue``; the DLQ of ``q`` is ``q`` + ``--dlq-suffix``, reported under ``q``):

- ``taskherd_queue_messages{queue,state="ready"|"unacked"}``
- ``taskherd_queue_oldest_message_age_seconds`` — oldest READY message (publish stamp; RabbitMQ
  quorum queues: the estimate of docs/queues.md)
- ``taskherd_queue_oldest_unacked_age_seconds`` and ``taskherd_queue_visibility_timeout_seconds`` (Redis)
- ``taskherd_queue_consumers`` (RabbitMQ)
- ``taskherd_dlq_messages{queue,dlq}``
- ``taskherd_exporter_poll_success``, ``taskherd_exporter_last_poll_timestamp_seconds``,
  ``taskherd_exporter_poll_duration_seconds``
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from taskherd.queues import BrokerUnreachable, QueueStats, inspect_queues

logger = logging.getLogger("taskherd.exporter")

DEFAULT_PORT = 9809  # 9808 is the worker metrics port (taskherd.worker.metrics)
DEFAULT_INTERVAL = 15.0
DEFAULT_DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True)
class Snapshot:
    stats: dict[str, QueueStats] = field(default_factory=dict)
    success: bool = False
    polled_at: float = 0.0
    duration_seconds: float = 0.0


def dlq_name(queue: str, suffix: str) -> str | None:
    return queue + suffix if suffix and not queue.endswith(suffix) else None


def metric_families(snapshot: Snapshot, queues: Iterable[str], dlq_suffix: str) -> list[GaugeMetricFamily]:
    """The exported metrics for one snapshot. Pure: tested without a broker or a server."""
    messages = GaugeMetricFamily("taskherd_queue_messages", "Messages in the queue by state (ready: waiting; "
                                 "unacked: delivered to a worker, not yet acknowledged)", labels=["queue", "state"])
    age = GaugeMetricFamily("taskherd_queue_oldest_message_age_seconds",
                            "Age of the oldest ready message, from its publish stamp", labels=["queue"])
    unacked_age = GaugeMetricFamily("taskherd_queue_oldest_unacked_age_seconds",
                                    "Age of the oldest unacknowledged delivery (Redis)", labels=["queue"])
    visibility = GaugeMetricFamily("taskherd_queue_visibility_timeout_seconds",
                                   "Redis visibility_timeout the unacked age is measured against", labels=["queue"])
    consumers = GaugeMetricFamily("taskherd_queue_consumers", "Consumers of the queue (RabbitMQ)", labels=["queue"])
    dlq = GaugeMetricFamily("taskherd_dlq_messages", "Messages in the queue's dead-letter queue",
                            labels=["queue", "dlq"])
    success = GaugeMetricFamily("taskherd_exporter_poll_success", "1 if the last broker poll succeeded")
    polled = GaugeMetricFamily("taskherd_exporter_last_poll_timestamp_seconds", "When the last poll ended")
    duration = GaugeMetricFamily("taskherd_exporter_poll_duration_seconds", "How long the last poll took")
    success.add_metric([], 1.0 if snapshot.success else 0.0)
    polled.add_metric([], snapshot.polled_at)
    duration.add_metric([], snapshot.duration_seconds)
    for queue in queues if snapshot.success else []:
        stats = snapshot.stats.get(queue)
        if stats is None:
            continue
        messages.add_metric([queue, "ready"], stats.ready)
        messages.add_metric([queue, "unacked"], stats.unacked)
        if stats.oldest_age_seconds is not None:
            age.add_metric([queue], stats.oldest_age_seconds)
        if stats.oldest_unacked_age_seconds is not None:
            unacked_age.add_metric([queue], stats.oldest_unacked_age_seconds)
        if stats.visibility_timeout_seconds is not None:
            visibility.add_metric([queue], stats.visibility_timeout_seconds)
        if stats.consumers is not None:
            consumers.add_metric([queue], stats.consumers)
        name = dlq_name(queue, dlq_suffix)
        if name and name in snapshot.stats:
            dlq.add_metric([queue, name], snapshot.stats[name].ready)
    return [messages, age, unacked_age, visibility, consumers, dlq, success, polled, duration]


class QueuePoller(Collector):
    """Polls the broker on demand (``poll``) and exposes the last snapshot to Prometheus."""

    def __init__(self, *, queues: list[str], dlq_suffix: str = DEFAULT_DLQ_SUFFIX,
                 inspect: Callable[[list[str]], dict[str, QueueStats]], clock: Callable[[], float] = time.time):
        self.queues = queues
        self.dlq_suffix = dlq_suffix
        self.inspect = inspect
        self.clock = clock
        self.snapshot = Snapshot()
        self._lock = threading.Lock()

    def names_to_inspect(self) -> list[str]:
        dlqs = [dlq_name(q, self.dlq_suffix) for q in self.queues]
        return list(dict.fromkeys(self.queues + [d for d in dlqs if d]))

    def poll(self) -> Snapshot:
        started = time.monotonic()
        try:
            stats, success = self.inspect(self.names_to_inspect()), True
        except BrokerUnreachable as exc:
            logger.warning("poll failed: %s", exc)
            stats, success = {}, False
        snapshot = Snapshot(stats=stats, success=success, polled_at=self.clock(),
                            duration_seconds=time.monotonic() - started)
        with self._lock:
            self.snapshot = snapshot
        return snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            snapshot = self.snapshot
        yield from metric_families(snapshot, self.queues, self.dlq_suffix)


def parse_args(argv: list[str]) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="taskherd exporter", description=__doc__.split("\n")[0])
    parser.add_argument("--broker-url", default=env("TASKHERD_BROKER_URL"),
                        help="redis://… or amqp://… (env TASKHERD_BROKER_URL)")
    parser.add_argument("--management-url", default=env("TASKHERD_MANAGEMENT_URL"),
                        help="RabbitMQ management API, http://user:pass@host:15672 (env TASKHERD_MANAGEMENT_URL; "
                             "default: the AMQP host on port 15672)")
    parser.add_argument("--queue", "-Q", action="append", default=[],
                        help="queue to watch; repeat or comma-separate (env TASKHERD_QUEUES)")
    parser.add_argument("--dlq-suffix", default=env("TASKHERD_DLQ_SUFFIX", DEFAULT_DLQ_SUFFIX),
                        help="the DLQ of queue q is q+SUFFIX; empty: no DLQ (default %(default)s)")
    parser.add_argument("--port", type=int, default=int(env("TASKHERD_EXPORTER_PORT", DEFAULT_PORT)))
    parser.add_argument("--address", default=env("TASKHERD_EXPORTER_ADDRESS", "0.0.0.0"))
    parser.add_argument("--interval", type=float, default=float(env("TASKHERD_EXPORTER_INTERVAL", DEFAULT_INTERVAL)),
                        help="seconds between broker polls (default %(default)s)")
    parser.add_argument("--global-keyprefix", default=env("TASKHERD_GLOBAL_KEYPREFIX", ""),
                        help="Redis: kombu's global_keyprefix transport option")
    parser.add_argument("--visibility-timeout", type=float, default=float(env("TASKHERD_VISIBILITY_TIMEOUT", 3600)),
                        help="Redis: kombu's visibility_timeout transport option (default %(default)s)")
    args = parser.parse_args(argv)
    raw_queues = args.queue or [env("TASKHERD_QUEUES", "")]
    args.queues = [q.strip() for item in raw_queues for q in item.split(",") if q.strip()]
    if not args.broker_url:
        parser.error("--broker-url (or TASKHERD_BROKER_URL) is required")
    if not args.queues:
        parser.error("at least one --queue (or TASKHERD_QUEUES) is required")
    if not args.interval > 0:
        parser.error(f"--interval={args.interval!r} must be > 0 seconds")
    if not 0 < args.port < 65536:
        parser.error(f"--port={args.port!r} must be within 1..65535")
    return args


def main(argv: list[str] | None = None) -> int:
    from prometheus_client import start_http_server

    args = parse_args(list(argv or []))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    def inspect(names: list[str]) -> dict[str, QueueStats]:
        return inspect_queues(args.broker_url, names, management_url=args.management_url,
                              global_keyprefix=args.global_keyprefix, visibility_timeout=args.visibility_timeout)

    poller = QueuePoller(queues=args.queues, dlq_suffix=args.dlq_suffix, inspect=inspect)
    registry = CollectorRegistry()
    registry.register(poller)
    poller.poll()  # the first scrape already has figures
    start_http_server(args.port, addr=args.address, registry=registry)
    logger.info("serving %d queue(s) on %s:%d, polling every %.0f s", len(args.queues), args.address, args.port,
                args.interval)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(args.interval):
        poller.poll()
    return 0
