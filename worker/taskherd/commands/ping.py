"""`taskherd ping`: send a ping task through the broker and wait for a worker to run it.

    taskherd ping -A myproject.celery -Q orders --timeout 120

Publishes like a producer of the app: with ``-A`` through that app (its queue declarations and
routing), else through an app set up by taskherd.worker.configure() from the pod's environment
(TASKHERD_BROKER_URL, TASKHERD_QUEUES, …, as the chart sets it), so the queue is declared exactly
as the workers declare it. Waits on a reply queue of its own for the worker's answer
(taskherd.worker.components.ping). Exit 0: a worker answered; 1: none within the timeout, or the
broker is unreachable; 2: usage. The chart's `helm test` runs it in a pod.
"""
from __future__ import annotations

import argparse
import sys
import time
import uuid

from . import options

#: how long the reply queue outlives a caller that died without deleting it (RabbitMQ x-expires)
REPLY_QUEUE_GRACE_SECONDS = 60


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = options.Parser(prog="taskherd ping", description=__doc__.split("\n")[0].split(": ", 1)[1])
    options.add_app(parser, "Celery app to publish with, as `celery -A` takes it (default: an app set up by "
                            "taskherd.worker.configure() from the environment)")
    options.add_broker(parser)
    options.add_queues(parser, "the queue to ping (its first, when several)")
    parser.add_argument("--timeout", type=options.seconds("--timeout"), default=120.0,
                        help="seconds to wait for a worker's answer (default: %(default)s)")
    args = parser.parse_args(argv)
    args.queues = options.queues(parser, args)
    if not args.queues:
        parser.error("a queue is required: -Q/--queues (or TASKHERD_QUEUES)")
    args.broker_flag = "-b/--broker" if args.broker is not None else "TASKHERD_BROKER_URL"
    options.broker(parser, args, required=False)
    if not args.app and not args.broker:
        parser.error("a broker is required: -b/--broker (or TASKHERD_BROKER_URL), or -A/--app")
    if args.broker and not args.app and _sentinel(args.broker):
        parser.error(f"{args.broker_flag}=sentinel://… {SENTINEL_NEEDS} (valid without -A/--app: "
                     f"{', '.join(f'{scheme}://' for scheme in PLAIN_SCHEMES)})")
    return args


#: kombu's Sentinel transport finds the master by name, a transport option (Celery's
#: broker_transport_options={"master_name": …}): ping has no flag for transport options, an app has them
SENTINEL_NEEDS = ("needs kombu's master_name transport option, which ping takes from the app of -A/--app "
                  "(its broker_transport_options)")
#: the broker schemes ping takes without -A: every one of the contract's but sentinel://
PLAIN_SCHEMES = tuple(scheme for scheme in options.contract.REDIS_SCHEMES + options.contract.AMQP_SCHEMES
                      if scheme != "sentinel")


def _sentinel(url: str) -> bool:
    return any(one.partition("://")[0].strip().lower() == "sentinel" for one in url.split(";"))


class SentinelWithoutMaster(ValueError):
    """-b names a sentinel:// broker and the app of -A sets no master_name: a usage error."""


def load_app(args: argparse.Namespace):
    from celery import Celery

    if args.app:
        app = options.load_app(args.app)
        if args.broker:
            app.conf.broker_url = args.broker
        if _sentinel(app.conf.broker_url or "") and not (app.conf.broker_transport_options or {}).get("master_name"):
            said = (f"{args.broker_flag}=sentinel://… needs kombu's master_name transport option, and "
                    f"-A/--app={args.app!r} sets none" if args.broker else
                    f"-A/--app={args.app!r}: its broker_url sentinel://… needs kombu's master_name transport "
                    f"option, and the app sets none")
            raise SentinelWithoutMaster(f"{said} (valid: an app whose broker_transport_options has master_name, "
                                        f"or a broker URL of {', '.join(f'{s}://' for s in PLAIN_SCHEMES)})")
        return app
    from taskherd.worker import configure

    app = Celery("taskherd-ping", broker=args.broker, set_as_current=False)
    configure(app, queues=list(args.queues))
    return app


def ping(app, queue: str, timeout: float) -> dict:
    """The first answer from a worker of ``queue``; raises TimeoutError when none comes in time."""
    from kombu import Queue

    from taskherd.worker.components.ping import TASK_NAME

    token = uuid.uuid4().hex
    reply_name = f"taskherd.ping.{token}"
    deadline = time.time() + timeout
    reply = Queue(reply_name, routing_key=reply_name, durable=False, auto_delete=True,
                  expires=timeout + REPLY_QUEUE_GRACE_SECONDS)
    with app.connection_for_read() as connection:
        with connection.SimpleQueue(reply, serializer="json", accept=["json"]) as inbox:
            # The SimpleQueue's consumer has declared the reply queue: it exists before a worker answers.
            app.send_task(TASK_NAME, args=[reply_name, token, deadline], queue=queue)
            while True:
                left = deadline - time.time()
                if left <= 0:
                    raise TimeoutError(queue)
                try:
                    message = inbox.get(block=True, timeout=min(left, 5.0))
                except inbox.Empty:
                    continue
                message.ack()
                if message.payload.get("token") == token:
                    return message.payload


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    queue = args.queues[0]
    started = time.monotonic()
    try:
        app = load_app(args)
        pong = ping(app, queue, args.timeout)
    except (options.AppNotFound, SentinelWithoutMaster) as exc:
        print(f"taskherd ping: {exc}", file=sys.stderr)
        return 2
    except options.AppImportFailed as failure:  # the user's module raised: its error and traceback
        options.report_app_import_failure("taskherd ping", failure)
        return 1
    except TimeoutError:
        print(f"taskherd ping: no worker of queue {queue!r} ran the ping within {args.timeout:g}s: is a worker consuming "
              f"{queue!r}, and does its app call taskherd.worker.configure()?", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - any broker or app error ends the command with its reason
        print(f"taskherd ping: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"pong from {pong.get('hostname')} (pid {pong.get('pid')}) through queue {queue!r} "
          f"in {time.monotonic() - started:.1f}s")
    return 0
