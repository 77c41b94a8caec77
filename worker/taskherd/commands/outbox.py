"""`taskherd outbox relay|migrate|status`: run the outbox relay, create its table, show what is pending
and what was set aside."""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time

from taskherd import contract

from . import options

#: Test hook: when set, the relay stops forever after publishing a batch and before marking it sent,
#: so a test can SIGKILL it at exactly that point. Never set it in production.
PAUSE_AFTER_PUBLISH_ENV = "TASKHERD_OUTBOX_TEST_PAUSE_AFTER_PUBLISH"


def _parser() -> argparse.ArgumentParser:
    parser = options.Parser(prog="taskherd outbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = options.Parser(add_help=False)
    common.add_argument("--dsn", help="PostgreSQL DSN (env TASKHERD_OUTBOX_DSN, then DATABASE_URL)")
    common.add_argument("--table", default="taskherd_outbox", type=_table_name,
                        help="the outbox table (default: %(default)s)")
    relay = sub.add_parser("relay", parents=[common], help="publish pending rows (safe as several replicas)")
    options.add_broker(relay)
    options.add_app(relay, "module:attribute of your Celery app, so that its queue declarations "
                           "(e.g. dead-letter arguments) and publish hooks are used")
    relay.add_argument("--batch-size", type=options.whole_number("--batch-size", 1, 10_000), default=100,
                       help="rows per transaction (default: %(default)s)")
    relay.add_argument("--poll-interval", type=options.seconds("--poll-interval"), default=1.0,
                       help="seconds between polls when idle (default: %(default)s)")
    relay.add_argument("--once", action="store_true", help="relay until nothing is pending, then exit")
    migrate = sub.add_parser("migrate", parents=[common], help="create the outbox table if missing")
    status = sub.add_parser("status", parents=[common], help="pending rows, the age of the oldest, and rows set aside")
    for command_parser in (relay, migrate, status):  # usage errors print the subcommand's own usage
        command_parser.set_defaults(command_parser=command_parser)
    return parser


def _table_name(raw: str) -> str:
    """--table, checked before anything connects (psycopg is imported only then)."""
    from taskherd.worker.outbox import VALID_TABLE, table_is_valid

    if not table_is_valid(raw):
        raise argparse.ArgumentTypeError(f"--table={raw!r} is not a table name (valid: {VALID_TABLE})")
    return raw


def _load_app(spec: str | None, broker_url: str | None):
    if spec:
        app = options.load_app(spec)
        if broker_url:
            app.conf.broker_url = broker_url
        return app
    from celery import Celery
    return Celery("taskherd-outbox", broker=broker_url, set_as_current=False)


def _pause_forever(rows) -> None:
    print(f"outbox test hook: published {len(rows)} rows, pausing before marking them sent", flush=True)
    while True:
        time.sleep(3600)


#: key=value password in a DSN or in libpq's echo of one: password=secret, password = 'a b\'c'
_KEY_VALUE_PASSWORD = re.compile(r"""(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s'"]+)""", re.IGNORECASE)


def _redacted(text: str, dsn: str | None = None) -> str:
    """``text`` (an error about ``dsn``) with no password in it: libpq's reasons repeat the DSN as
    written (missing "=" after "mysql://u:s3cr3t@…"), so the URL's password, a key=value password and
    ``dsn``'s own password wherever it appears are replaced by ***."""
    text = _KEY_VALUE_PASSWORD.sub(r"\1***", contract.redact(text))
    parsed = {}
    if dsn:
        from psycopg import conninfo
        try:
            parsed = conninfo.conninfo_to_dict(dsn)
        except Exception:  # noqa: BLE001 - not parseable: the URL and key=value rules above still apply
            parsed = {}
    password = parsed.get("password")
    # Not when 1-2 characters ("a" would blank every a of the text), nor when it is also the user,
    # database or host name, which the message shows anyway (redact() keeps the user name).
    if password and len(password) >= 3 and password not in (parsed.get("user"), parsed.get("dbname"),
                                                                parsed.get("host")):
        text = text.replace(password, "***")
    return text


def _one_line(exc: BaseException, dsn: str | None) -> str:
    """The error's text on one line (libpq's spans lines), passwords hidden."""
    return _redacted(" ".join(str(exc).split()), dsn)


#: the values libpq takes for the connection options it checks before connecting (PostgreSQL 18's
#: libpq; a value added later is refused by it too, with the same words, at connect time)
_OPTION_VALUES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby", "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
}
_INTEGER_OPTIONS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                    "tcp_user_timeout")


def _option_problem(options: dict[str, str]) -> str | None:
    """What libpq would refuse in these parsed connection options without connecting, or None."""
    for option, values in _OPTION_VALUES.items():
        value = options.get(option)
        if value is not None and value not in values:
            return f"{option}={contract.shown(value)} is not one of {', '.join(values)}"
    for port in (options.get("port") or "").split(","):
        port = port.strip()
        if port and not re.fullmatch(contract.PORT, port):
            return f"port={contract.shown(port)} is not a port number (valid: 1..65535; several hosts: 5432,5433)"
    for option in _INTEGER_OPTIONS:
        value = options.get(option)
        if value is not None and not re.fullmatch(r"\s*-?[0-9]+\s*", value):
            return f"{option}={contract.shown(value)} is not an integer (valid: a whole number of seconds, or count)"
    return None


def _dsn(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """--dsn, else $TASKHERD_OUTBOX_DSN, else $DATABASE_URL; a usage error naming where it came from
    when it is missing or psycopg cannot parse it (checked before connecting: no traceback)."""
    from psycopg import conninfo

    source = "--dsn"
    if args.dsn is not None and not args.dsn.strip():
        parser.error("--dsn is empty (valid: postgresql://user:password@host:5432/database or 'host=… dbname=…'; "
                     "leave it out to use TASKHERD_OUTBOX_DSN / DATABASE_URL)")
    if args.dsn is None:
        args.dsn, source = options.from_env(parser, "TASKHERD_OUTBOX_DSN"), "TASKHERD_OUTBOX_DSN"
        if not args.dsn:
            args.dsn, source = os.environ.get("DATABASE_URL", "").strip() or None, "DATABASE_URL"
    if not args.dsn:
        parser.error("--dsn is required (or set TASKHERD_OUTBOX_DSN / DATABASE_URL)")
    valid = "postgresql://user:password@host:5432/database or 'host=… dbname=…'"
    try:
        parsed = conninfo.conninfo_to_dict(args.dsn)
    except Exception as exc:  # noqa: BLE001 - psycopg.ProgrammingError, with libpq's reason
        parser.error(f"{source}={_redacted(repr(args.dsn), args.dsn)} is not a PostgreSQL DSN "
                     f"({_one_line(exc, args.dsn)}); valid: {valid}")
    # A value libpq refuses before connecting (sslmode=bogus, port abc) is the command line's
    # mistake, not the database's: a usage error, exit 2, as the DSN that does not parse.
    problem = _option_problem(parsed)
    if problem:
        parser.error(f"{source}={_redacted(repr(args.dsn), args.dsn)} is refused by libpq before connecting: "
                     f"{_redacted(problem, args.dsn)}; valid: {valid}, with libpq's options at values it takes")
    return args.dsn


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _dsn(args.command_parser, args)
    if args.command == "relay":
        options.broker(args.command_parser, args, required=False)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import psycopg
    from amqp.exceptions import PreconditionFailed

    try:
        return _run(args)
    except options.AppNotFound as exc:
        print(f"taskherd outbox {args.command}: {_redacted(str(exc), args.dsn)}", file=sys.stderr)
        return 2
    except options.AppImportFailed as failure:  # the user's module raised: its error and traceback
        options.report_app_import_failure(f"taskherd outbox {args.command}", failure)
        return 1
    except psycopg.errors.UndefinedTable:
        print(f"taskherd outbox {args.command}: there is no table {args.table!r} in this database (--table; "
              f"`taskherd outbox migrate --table {args.table}` creates it)", file=sys.stderr)
        return 1
    except PreconditionFailed as exc:
        # without -A the relay declares a bare queue; the workers' profile declares it with
        # dead-letter arguments, and RabbitMQ refuses a second declaration that differs
        print(f"taskherd outbox relay: RabbitMQ refused to declare a queue as this relay would: "
              f"{_one_line(exc, args.dsn)}; valid: -A/--app module:app, so that the relay declares queues "
              f"as your workers do (configure() sets their arguments)", file=sys.stderr)
        return 1
    except psycopg.errors.InsufficientPrivilege as exc:
        print(f"taskherd outbox {args.command}: the database refused: {_one_line(exc, args.dsn)} (a relay adds "
              f"the `refused` column to a table taskherd 0.1 created: `taskherd outbox migrate --table {args.table}` "
              f"run as the table's owner does it once)", file=sys.stderr)
        return 1
    except psycopg.OperationalError as exc:
        # Unreachable database, refused login, bad port: one line; the outbox rows stay as they were.
        print(f"taskherd outbox {args.command}: cannot use the database: {type(exc).__name__}: "
              f"{_one_line(exc, args.dsn)}", file=sys.stderr)  # libpq's message spans lines
        return 1


def _run(args: argparse.Namespace) -> int:
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
        with connect() as conn:
            status = outbox.status(conn, table=args.table)
        print(f"pending {status.pending}  oldest_age_seconds {status.oldest_age_seconds:.1f}  refused {status.refused}")
        for row_id, why in status.refused_examples:
            print(f"refused {row_id}: {why}")
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
        print(f"taskherd outbox relay: {_redacted(str(exc), args.dsn)}", file=sys.stderr)
        return 2
    stop = threading.Event()
    # SIGTERM finishes the batch in hand, then exits: nothing to roll back on a rolling update.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    total = relay.run(once=args.once, stop=stop)
    print(f"outbox relay {relay.name}: relayed {total} rows", flush=True)
    return 0
