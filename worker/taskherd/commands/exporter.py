"""`taskherd exporter`: queue depth, age, consumers and DLQ depth as Prometheus metrics.

Polls the broker every ``--interval`` seconds with taskherd.queues (the same inspection the
operator uses) and serves the last poll on ``--port``. A failed poll exports no queue figures
(stale ones would look healthy) and sets ``taskherd_exporter_poll_success`` to 0.

Whatever fails while inspecting (the broker unreachable, any error it or its management API
answers with: a key of the wrong type, an ACL refusal, a 401/403/5xx, a malformed reply) is a
failed poll, logged in one line naming the queue and the broker's own error (URL without its
password); the exporter keeps serving and the next poll that reads the broker recovers by itself.
One bad queue among good ones (its key of the wrong type, a 5xx for that queue only) does not hide
the others: their figures are still exported, the bad queue's series are absent, and
``taskherd_exporter_queue_poll_success{queue}`` is 0 for it (1 for each queue read; DLQs under
their own name); ``taskherd_exporter_poll_success`` is 0 whenever any queue was not read. A
';'-joined failover list is polled from the URL that answered last, as kombu's connection stays on
the broker it reached: a first URL that accepts connections but never answers costs only the
poll that finds it out, not every poll.

Metrics (label ``queue``; the DLQ of each queue, from ``--dead-letter-queues`` or
``--dead-letter-pattern``, is reported under its work queue):

- ``taskherd_queue_messages{queue,state="ready"|"unacked"}``
- ``taskherd_queue_oldest_message_age_seconds`` — oldest READY message (publish stamp; RabbitMQ
  quorum queues: the estimate of docs/queues.md)
- ``taskherd_queue_oldest_unacked_age_seconds`` and ``taskherd_queue_visibility_timeout_seconds`` (Redis)
- ``taskherd_queue_consumers`` (RabbitMQ)
- ``taskherd_dlq_messages{queue,dlq}``
- ``taskherd_exporter_poll_success``, ``taskherd_exporter_queue_poll_success{queue}``,
  ``taskherd_exporter_last_poll_timestamp_seconds``, ``taskherd_exporter_poll_duration_seconds``
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
from taskherd.queues import FailoverMemory, QueueStats, QueuesUnreadable, inspect_queues

from . import options

logger = logging.getLogger("taskherd.exporter")
#: libraries that log every request at INFO (RabbitMQ's management API, read through httpx); their
#: warnings and errors still show
NOISY_LOGGERS = ("httpx", "httpcore")


@dataclass(frozen=True)
class Snapshot:
    stats: dict[str, QueueStats] = field(default_factory=dict)
    #: every queue was read
    success: bool = False
    polled_at: float = 0.0
    duration_seconds: float = 0.0
    #: queue -> why it was not read, when the broker answered for the others (whose figures in
    #: ``stats`` are exported); empty with ``success`` False: the whole poll failed, nothing exported
    queue_errors: dict[str, str] = field(default_factory=dict)

    @property
    def answered(self) -> bool:
        """The broker answered this poll, for every queue or for some."""
        return self.success or bool(self.queue_errors)


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
    success = GaugeMetricFamily("taskherd_exporter_poll_success",
                                "1 if the last broker poll read every queue (0: the broker, or some queue, "
                                "could not be read: see taskherd_exporter_queue_poll_success)")
    queue_success = GaugeMetricFamily("taskherd_exporter_queue_poll_success",
                                      "1 if the last broker poll read the queue (a DLQ under its own name); "
                                      "0: its figures are absent, the exporter's log says why", labels=["queue"])
    polled = GaugeMetricFamily("taskherd_exporter_last_poll_timestamp_seconds", "When the last poll ended")
    duration = GaugeMetricFamily("taskherd_exporter_poll_duration_seconds", "How long the last poll took")
    success.add_metric([], 1.0 if snapshot.success else 0.0)
    polled.add_metric([], snapshot.polled_at)
    duration.add_metric([], snapshot.duration_seconds)
    answered = snapshot.answered
    read = {name for name in snapshot.stats if name not in snapshot.queue_errors} if answered else set()
    for name in dict.fromkeys([*dead_letters, *dead_letters.values()]):
        queue_success.add_metric([name], 1.0 if name in read else 0.0)
    for queue in dead_letters:
        stats = snapshot.stats.get(queue) if queue in read else None
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
    for queue, name in dead_letters.items():  # a DLQ read is reported even when its work queue was not
        if name in read and not snapshot.stats[name].pending:
            dlq.add_metric([queue, name], snapshot.stats[name].ready)
    return [messages, age, lower_bound, unacked_age, visibility, consumers, dlq, success, queue_success, polled,
            duration, build_info()]


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
        """One poll; never raises: whatever fails is a failed poll (module docstring)."""
        started = time.monotonic()
        names = self.names_to_inspect()
        errors: dict[str, str] = {}
        try:
            stats, success = self.inspect(names), True
        except QueuesUnreadable as exc:  # the broker answered, not for every queue
            stats, success = exc.stats, False
            errors = {name: why for name, why in exc.errors.items() if name in names} or {name: str(exc) for name in names}
            for name, why in errors.items():
                logger.warning("poll failed for queue %r: %s", name,
                               contract.redact(f"{exc.where}: {why}" if exc.where else why))
        except Exception as exc:  # noqa: BLE001 - anything a broker, its API or a client library raises
            logger.warning("poll failed (queues %s): %s", ", ".join(map(repr, names)),
                           contract.redact(f"{type(exc).__name__}: {exc}"))
            stats, success = {}, False
        snapshot = Snapshot(stats=stats, success=success, polled_at=self.clock(),
                            duration_seconds=time.monotonic() - started, queue_errors=errors)
        with self._lock:
            if snapshot.success and not self.snapshot.success and self.snapshot.polled_at:
                logger.info("poll succeeded again: every queue read")
            self.snapshot = snapshot
        return snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            snapshot = self.snapshot
        yield from metric_families(snapshot, self.dead_letters)


#: what taskherd.queues reads: Redis with redis-py, RabbitMQ's management API from the URL's host and vhost
SCHEMES = contract.REDIS_PY_SCHEMES + contract.PY_AMQP_SCHEMES


#: what --help says of failures (the module docstring's second paragraph, in short)
EPILOG = ("A poll that fails exports no queue figures and sets taskherd_exporter_poll_success to 0; the exporter "
          "logs one line naming the queue and the broker's error, keeps serving, and recovers by itself. Whatever "
          "fails counts: the broker unreachable, a key of the wrong type, an ACL refusal, a management API "
          "401/403/5xx or malformed reply. One bad queue fails alone: the other queues are still exported, and "
          "taskherd_exporter_queue_poll_success{queue} is 0 for it. A ';'-joined failover list is polled from "
          "the URL that answered last.")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options.Parser(prog="taskherd exporter", description=__doc__.split("\n")[0], epilog=EPILOG)
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

    failover = FailoverMemory()  # each poll starts from the URL that answered last

    def inspect(names: list[str]) -> dict[str, QueueStats]:
        return inspect_queues(args.broker, names, management_url=args.management_url,
                              global_keyprefix=args.global_keyprefix, visibility_timeout=args.visibility_timeout,
                              failover=failover)

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
