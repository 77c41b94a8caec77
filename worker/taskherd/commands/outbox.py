"""`taskherd outbox relay|migrate|status`: run the outbox relay, create its table, show what is pending."""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from taskherd import contract

from . import options

#: Test hook: when set, the relay stops forever after publishing a batch and before marking it sent,
#: so a test can SIGKILL it at exactly that point. Never set it in production.
PAUSE_AFTER_PUBLISH_ENV = "TASKHERD_OUTBOX_TEST_PAUSE_AFTER_PUBLISH"


def _dsn_default() -> str | None:
    return contract.read(("TASKHERD_OUTBOX_DSN",))[0]["TASKHERD_OUTBOX_DSN"] or os.environ.get("DATABASE_URL") or None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taskherd outbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dsn", default=_dsn_default(),
                        help="PostgreSQL DSN (env TASKHERD_OUTBOX_DSN, then DATABASE_URL)")
    common.add_argument("--table", default="taskherd_outbox")
    relay = sub.add_parser("relay", parents=[common], help="publish pending rows (safe as several replicas)")
    options.add_broker(relay)
    options.add_app(relay, "module:attribute of your Celery app, so that its queue declarations "
                           "(e.g. dead-letter arguments) and publish hooks are used")
    relay.add_argument("--batch-size", type=int, default=100)
    relay.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls when idle")
    relay.add_argument("--once", action="store_true", help="relay until nothing is pending, then exit")
    sub.add_parser("migrate", parents=[common], help="create the outbox table if missing")
    sub.add_parser("status", parents=[common], help="pending rows and the age of the oldest")
    return parser


def _load_app(spec: str | None, broker_url: str | None):
    if spec:
        import importlib
        module_name, _, attr = spec.partition(":")
        app = getattr(importlib.import_module(module_name), attr or "app")
        if broker_url:
            app.conf.broker_url = broker_url
        return app
    from celery import Celery
    return Celery("taskherd-outbox", broker=broker_url, set_as_current=False)


def _pause_forever(rows) -> None:
    print(f"outbox test hook: published {len(rows)} rows, pausing before marking them sent", flush=True)
    while True:
        time.sleep(3600)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.dsn:
        print("taskherd outbox: --dsn is required (or set TASKHERD_OUTBOX_DSN / DATABASE_URL)", file=sys.stderr)
        return 2
    import psycopg

    from taskherd.worker import outbox

    def connect():
        # The application name lets operators (and tests) see the relays in pg_stat_activity.
        return psycopg.connect(args.dsn, application_name=f"taskherd-outbox-{args.command}")

    if args.command == "migrate":
        with connect() as conn:
            outbox.create_table(conn, table=args.table)
        print(f"outbox table {args.table} is ready")
        return 0
    if args.command == "status":
        from psycopg import sql
        with connect() as conn:
            pending, oldest = conn.execute(sql.SQL(
                "SELECT count(*), extract(epoch FROM now() - min(created_at)) FROM {t} WHERE sent_at IS NULL")
                .format(t=sql.Identifier(args.table))).fetchone()
        print(f"pending {pending}  oldest_age_seconds {float(oldest or 0):.1f}")
        return 0

    if not args.broker and not args.app:
        print("taskherd outbox relay: -b/--broker is required (or set TASKHERD_BROKER_URL), or -A/--app with "
              "its own broker_url", file=sys.stderr)
        return 2
    publisher = outbox.CeleryPublisher(app=_load_app(args.app, args.broker))
    try:
        relay = outbox.Relay(connect=connect, publish=publisher.publish, batch_size=args.batch_size,
                             poll_interval_seconds=args.poll_interval, table=args.table,
                             after_publish=_pause_forever if os.environ.get(PAUSE_AFTER_PUBLISH_ENV) else None,
                             name=f"{os.uname().nodename}:{os.getpid()}")
    except ValueError as exc:
        print(f"taskherd outbox relay: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    # SIGTERM finishes the batch in hand, then exits: nothing to roll back on a rolling update.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    total = relay.run(once=args.once, stop=stop)
    print(f"outbox relay {relay.name}: relayed {total} rows", flush=True)
    return 0
