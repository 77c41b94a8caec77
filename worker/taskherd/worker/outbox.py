"""Transactional outbox: a task enqueued in the caller's PostgreSQL transaction, relayed later.

    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("insert into orders ...")
        outbox.enqueue(conn, "shop.ship", args=[order_id], queue="shipping")
    # commit: the order and its task exist together; rollback: neither does.

The relay (`taskherd outbox relay`, or `Relay.run`) takes pending rows in batches with
`SELECT … FOR UPDATE SKIP LOCKED` (so several replicas share the table without publishing the same
row concurrently), publishes each one (with publisher confirms on RabbitMQ), then marks the batch
sent and commits. Killed at any point, it loses nothing: its transaction rolls back, the row locks
go with it, and the rows are published again by the next relay. A row published but not marked is
therefore published twice; its message carries a stable task id (the row's id), so a consumer
guarded by `idempotent(key=lambda task, *a: task.request.id)` runs the effect once.
"""
from __future__ import annotations

import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from psycopg import sql

from taskherd.contract import broker_kind

from . import celery_json
from .profile import REDIS_TRANSPORT_DEFAULTS

logger = logging.getLogger(__name__)

DEFAULT_TABLE = "taskherd_outbox"
#: kombu Redis transport options of the relay's publishes, seconds (CeleryPublisher says why):
#: configure()'s connect timeout, and a read timeout a consuming worker cannot have
REDIS_PUBLISH_TIMEOUTS = {**REDIS_TRANSPORT_DEFAULTS, "socket_timeout": 10.0}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _table(table: str) -> sql.Identifier:
    if not _IDENTIFIER.match(table):
        raise ValueError(f"outbox table={table!r}; valid: an unquoted identifier "
                         "(letters, digits, underscore, at most 63 characters)")
    return sql.Identifier(table)


def create_table(conn, *, table: str = DEFAULT_TABLE) -> None:
    """Creates the outbox table and its pending-rows index if missing (safe on every start)."""
    t = _table(table)
    with conn.transaction():
        conn.execute(sql.SQL("""
            CREATE TABLE IF NOT EXISTS {t} (
                id          uuid PRIMARY KEY,
                task_name   text NOT NULL,
                args        jsonb NOT NULL DEFAULT '[]',
                kwargs      jsonb NOT NULL DEFAULT '{{}}',
                queue       text,
                created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
                sent_at     timestamptz,
                relayed_by  text
            )""").format(t=t))
        conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (created_at) WHERE sent_at IS NULL")
                     .format(i=sql.Identifier(f"{table}_pending"), t=t))


def enqueue(conn, task_name: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *,
            queue: str | None = None, table: str = DEFAULT_TABLE) -> str:
    """Adds a task to the outbox in the caller's current transaction; returns its task id.

    Nothing is published here: the row becomes visible to the relay when the caller commits.
    """
    if not isinstance(task_name, str) or not task_name:
        raise ValueError(f"outbox task_name={task_name!r}; valid: a registered task name")
    # Refused before the INSERT: a failed statement would abort the caller's whole transaction.
    args_text, kwargs_text = _arguments_text(args, kwargs)
    task_id = str(uuid.uuid4())
    conn.execute(sql.SQL("INSERT INTO {t} (id, task_name, args, kwargs, queue) "
                         "VALUES (%s, %s, %s::jsonb, %s::jsonb, %s)").format(t=_table(table)),
                 (task_id, task_name, args_text, kwargs_text, queue))
    return task_id


def _arguments_text(args: object, kwargs: object) -> tuple[str, str]:
    """args and kwargs as Celery's JSON serializer writes a task's (so `.delay()`'s datetimes,
    Decimals, UUIDs, bytes… reach the task as they would without the outbox), or an error naming
    the argument. The types are Celery's own rules for a message body: anything else is a message
    the worker fails (a str would even be spread into one argument per character)."""
    if not isinstance(args, (list, tuple)):
        raise TypeError(f"outbox args= got a {type(args).__name__}; valid: a list or tuple of the task's "
                        "positional arguments (args=[order_id], not args=order_id)")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"outbox kwargs= got a {type(kwargs).__name__}; valid: a mapping of the task's "
                        "keyword arguments with str keys (kwargs={'order_id': 5}), or None")
    bad_keys = [key for key in kwargs if not isinstance(key, str)]
    if bad_keys:
        raise TypeError(f"outbox kwargs= has keys {bad_keys[:3]!r} that are not str; valid: a mapping with "
                        "str keys (the task's parameter names)")
    return _json_text("args", list(args)), _json_text("kwargs", dict(kwargs))


def _json_text(argument: str, value: Any) -> str:
    try:
        return celery_json.dumps(value, for_jsonb=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"outbox {argument}= cannot be stored ({exc}); valid: {celery_json.VALID}") from exc


def purge_sent(conn, *, older_than_seconds: float, table: str = DEFAULT_TABLE) -> int:
    """Deletes rows sent longer ago than the window you want to keep for auditing."""
    with conn.transaction():
        return conn.execute(sql.SQL("DELETE FROM {t} WHERE sent_at < now() - make_interval(secs => %s)")
                            .format(t=_table(table)), (older_than_seconds,)).rowcount


@dataclass(frozen=True)
class OutboxRow:
    id: str
    task_name: str
    args: list
    kwargs: dict
    queue: str | None


class CeleryPublisher:
    """Publishes rows as Celery task messages whose task id is the row id.

    On RabbitMQ it turns on publisher confirms (`confirm_publish`), so each publish returns only once
    the broker has the message and raises if the broker refuses it. On Redis, LPUSH's reply is the
    confirmation, awaited at most REDIS_PUBLISH_TIMEOUTS: kombu's own connections have no timeouts,
    and a relay once waited 140 s on one to a Redis restarting behind its Service while the rows
    piled up (the chaos suite's broker restart on kind). A relay only publishes, so unlike a
    worker it can have a read timeout too. An app's own settings win.
    """

    def __init__(self, *, app):
        kind = broker_kind(app.conf.broker_url)
        options = dict(app.conf.broker_transport_options or {})
        if kind == "amqp":
            options["confirm_publish"] = True
        elif kind == "redis":
            for option, value in REDIS_PUBLISH_TIMEOUTS.items():
                options.setdefault(option, value)
        app.conf.broker_transport_options = options
        self.app = app

    def publish(self, rows: Iterable[OutboxRow]) -> None:
        with self.app.producer_or_acquire() as producer:
            for row in rows:
                options = {"queue": row.queue} if row.queue else {}
                self.app.send_task(row.task_name, args=row.args, kwargs=row.kwargs, task_id=row.id,
                                   producer=producer, **options)


@dataclass
class Relay:
    #: returns a new psycopg connection (called again after a connection error)
    connect: Callable[[], Any]
    #: publishes a batch; must raise if any row was not accepted by the broker
    publish: Callable[[list[OutboxRow]], None]
    #: rows per transaction: larger amortises commits, smaller re-publishes less after a crash
    batch_size: int = 100
    #: seconds between polls when the table has nothing pending
    poll_interval_seconds: float = 1.0
    table: str = DEFAULT_TABLE
    #: called after a batch is published and before it is marked sent (tests use it to crash there)
    after_publish: Callable[[list[OutboxRow]], None] | None = None
    name: str = field(default_factory=lambda: socket.gethostname())

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or not 1 <= self.batch_size <= 10_000:
            raise ValueError(f"outbox relay batch_size={self.batch_size!r}; valid: an integer in 1..10000")
        if not self.poll_interval_seconds > 0:
            raise ValueError(f"outbox relay poll_interval_seconds={self.poll_interval_seconds!r}; valid: > 0")
        self._t = _table(self.table)
        self._conn = None

    def relay_batch(self) -> int:
        """One transaction: lock up to batch_size pending rows, publish them, mark them sent."""
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
        conn = self._conn
        with conn.transaction():
            # args and kwargs as text, for Celery's JSON decoder: kombu's typed values (a datetime…)
            # become what the producer passed, not the dicts that encode them.
            records = conn.execute(sql.SQL(
                "SELECT id, task_name, args::text, kwargs::text, queue FROM {t} WHERE sent_at IS NULL "
                "ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED").format(t=self._t),
                (self.batch_size,)).fetchall()
            if not records:
                return 0
            rows = [OutboxRow(str(r[0]), r[1], celery_json.loads(r[2]), celery_json.loads(r[3]), r[4])
                    for r in records]
            self.publish(rows)
            if self.after_publish is not None:
                self.after_publish(rows)
            conn.execute(sql.SQL("UPDATE {t} SET sent_at = clock_timestamp(), relayed_by = %s WHERE id = ANY(%s)")
                         .format(t=self._t), (self.name, [row.id for row in rows]))
        return len(rows)

    def run(self, *, once: bool = False, stop: threading.Event | None = None) -> int:
        """Relays until `stop` is set (or, with `once`, until nothing is pending); returns rows relayed."""
        stop = stop or threading.Event()
        total = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                count = self.relay_batch()
            except Exception:
                # Broker or database unreachable: the batch rolled back, nothing is lost; try again later.
                self._close()
                if once:
                    raise  # the command says why, in one line
                logger.exception("outbox relay %s: batch failed, retrying in %ss", self.name, self.poll_interval_seconds)
                stop.wait(self.poll_interval_seconds)
                continue
            total += count
            if count:
                logger.info("outbox relay %s: relayed %d rows in %.3fs (total %d)",
                            self.name, count, time.monotonic() - started, total)
            if count < self.batch_size:
                if once:
                    break
                stop.wait(self.poll_interval_seconds)
        self._close()
        return total

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
