"""`taskherd exporter`: queue depth, age, consumers and DLQ depth as Prometheus metrics.

Polls the broker every ``--interval`` seconds with taskherd.queues (the same inspection the
operator uses) and serves the last poll on ``--port``. A failed poll exports no queue figures
(stale ones would look healthy) and sets ``taskherd_exporter_poll_success`` to 0.

Metrics (label ``queue``; the DLQ of each queue, from ``--dead-letter-queues`` or
``--dead-letter-pattern``, is reported under its work queue):

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
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from taskherd import contract
from taskherd.build_info import build_info
from taskherd.queues import BrokerUnreachable, QueueStats, inspect_queues

from . import options

logger = logging.getLogger("taskherd.exporter")
#: libraries that log every request at INFO (RabbitMQ's management API, read through httpx); their
#: warnings and errors still show
NOISY_LOGGERS = ("httpx", "httpcore")


@dataclass(frozen=True)
class Snapshot:
    stats: dict[str, QueueStats] = field(default_factory=dict)
    success: bool = False
    polled_at: float = 0.0
    duration_seconds: float = 0.0


def metric_families(snapshot: Snapshot, dead_letters: dict[str, str]) -> list[GaugeMetricFamily]:
    """The exported metrics for one snapshot. Pure: tested without a broker or a server."""
    messages = GaugeMetricFamily("taskherd_queue_messages", "Messages in the queue by state (ready: waiting; "
                                 "unacked: delivered to a worker, not yet acknowledged)", labels=["queue", "state"])
    age = GaugeMetricFamily("taskherd_queue_oldest_message_age_seconds",
                            "Age of the oldest ready message, from its publish stamp (a lower bound where "
                            "taskherd_queue_oldest_message_age_is_lower_bound is 1)", labels=["queue"])
    lower_bound = GaugeMetricFamily("taskherd_queue_oldest_message_age_is_lower_bound",
                                    "1 when the broker only tells how old the oldest message is at least "
                                    "(RabbitMQ without a head timestamp)", labels=["queue"])
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
    for queue in dead_letters if snapshot.success else []:
        stats = snapshot.stats.get(queue)
        if stats is None or stats.pending:
            continue  # RabbitMQ has not reported the queue yet: its zeros would mean "unknown"
        messages.add_metric([queue, "ready"], stats.ready)
        messages.add_metric([queue, "unacked"], stats.unacked)
        if stats.oldest_age_seconds is not None:
            age.add_metric([queue], stats.oldest_age_seconds)
            lower_bound.add_metric([queue], 1.0 if stats.oldest_age_is_lower_bound else 0.0)
        if stats.oldest_unacked_age_seconds is not None:
            unacked_age.add_metric([queue], stats.oldest_unacked_age_seconds)
        if stats.visibility_timeout_seconds is not None:
            visibility.add_metric([queue], stats.visibility_timeout_seconds)
        if stats.consumers is not None:
            consumers.add_metric([queue], stats.consumers)
        name = dead_letters[queue]
        if name in snapshot.stats and not snapshot.stats[name].pending:
            dlq.add_metric([queue, name], snapshot.stats[name].ready)
    return [messages, age, lower_bound, unacked_age, visibility, consumers, dlq, success, polled, duration,
            build_info()]


class QueuePoller(Collector):
    """Polls the broker on demand (``poll``) and exposes the last snapshot to Prometheus."""

    def __init__(self, *, dead_letters: dict[str, str],
                 inspect: Callable[[list[str]], dict[str, QueueStats]], clock: Callable[[], float] = time.time):
        #: work queue -> its DLQ
        self.dead_letters = dict(dead_letters)
        self.inspect = inspect
        self.clock = clock
        self.snapshot = Snapshot()
        self._lock = threading.Lock()

    def names_to_inspect(self) -> list[str]:
        return list(dict.fromkeys([*self.dead_letters, *self.dead_letters.values()]))

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
        yield from metric_families(snapshot, self.dead_letters)


#: what taskherd.queues reads: Redis with redis-py, RabbitMQ's management API from the URL's host and vhost
SCHEMES = contract.REDIS_PY_SCHEMES + contract.PY_AMQP_SCHEMES


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options.Parser(prog="taskherd exporter", description=__doc__.split("\n")[0])
    options.add_broker(parser, SCHEMES)
    parser.add_argument("--management-url", default=None, type=options.base_url("--management-url"),
                        help="RabbitMQ management API, http://user:pass@host:15672 (default: $TASKHERD_MANAGEMENT_URL, "
                             "else the AMQP host on port 15672)")
    options.add_queues(parser, "queues to watch")
    options.add_dead_letter_naming(parser)
    options.add_keyprefix(parser)
    # Defaults are read after parsing (options.from_env): a bad variable is a usage error naming it,
    # and never blocks a command line that overrides it.
    parser.add_argument("--port", type=options.whole_number("--port", 1, 65535),
                        help=f"port of /metrics (default: $TASKHERD_EXPORTER_PORT, else {contract.EXPORTER_PORT})")
    parser.add_argument("--address", default="0.0.0.0", type=options.listen_address("--address"),
                        help="address of /metrics, judged as TASKHERD_METRICS_ADDR (default: %(default)s)")
    parser.add_argument("--interval", type=options.seconds("--interval"),
                        help="seconds between broker polls (default: $TASKHERD_EXPORTER_INTERVAL, else "
                             f"{contract.BY_NAME['TASKHERD_EXPORTER_INTERVAL'].default:g})")
    parser.add_argument("--visibility-timeout", type=options.seconds("--visibility-timeout",
                                                                      maximum=contract.MAX_TIMEOUT_SECONDS),
                        help="Redis: kombu's visibility_timeout transport option (default: "
                             "$TASKHERD_VISIBILITY_TIMEOUT, else 3600)")
    args = parser.parse_args(argv)
    # taskherd.queues reads Redis with redis-py and RabbitMQ's management API, a failover list at
    # its first URL that answers: the workers' Secret is the exporter's too
    options.broker(parser, args, schemes=SCHEMES)
    if args.management_url is None:
        args.management_url = options.from_env(parser, "TASKHERD_MANAGEMENT_URL")
    if args.port is None:
        args.port = options.from_env(parser, "TASKHERD_EXPORTER_PORT")
    if args.interval is None:
        args.interval = options.from_env(parser, "TASKHERD_EXPORTER_INTERVAL")
    if args.visibility_timeout is None:
        args.visibility_timeout = options.from_env(parser, "TASKHERD_VISIBILITY_TIMEOUT") or 3600.0
    args.queues = options.queues(parser, args)
    if not args.queues:
        parser.error("at least one -Q/--queues (or TASKHERD_QUEUES) is required")
    args.dead_letters = options.dead_letter_queues(parser, args, args.queues)
    return args


def main(argv: list[str] | None = None) -> int:
    from prometheus_client import start_http_server

    args = parse_args(list(argv or []))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in NOISY_LOGGERS:  # httpx logs every management API request at INFO: two lines a queue a poll
        logging.getLogger(noisy).setLevel(logging.WARNING)

    def inspect(names: list[str]) -> dict[str, QueueStats]:
        return inspect_queues(args.broker, names, management_url=args.management_url,
                              global_keyprefix=args.global_keyprefix, visibility_timeout=args.visibility_timeout)

    poller = QueuePoller(dead_letters=args.dead_letters, inspect=inspect)
    registry = CollectorRegistry()
    registry.register(poller)
    poller.poll()  # the first scrape already has figures
    try:
        start_http_server(args.port, addr=args.address, registry=registry)
    except OSError as exc:  # port taken, address not of this host or not resolvable: one line, no traceback
        print(f"taskherd exporter: cannot serve /metrics on --address={args.address!r} --port={args.port}: {exc}",
              file=sys.stderr)
        return 1
    logger.info("serving %d queue(s) on %s:%d, polling every %.0f s", len(args.queues), args.address, args.port,
                args.interval)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(args.interval):
        poller.poll()
    return 0
