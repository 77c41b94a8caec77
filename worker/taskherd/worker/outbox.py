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

A row that can never become a task message (written by hand or by another program: `args` that is
not a JSON array, a typed value Celery cannot read back, a queue name no broker takes or py-amqp
cannot send…) is set aside, not published: its `refused` column says why, the relay logs it, and
the rows behind it go on (`taskherd outbox status` counts them). Fix the row and set `refused` to
NULL to relay it. A queue the broker refuses to this relay (RabbitMQ: declared with other
arguments, not permitted; Redis: its key holds another type) is held: its rows wait, the other
queues' rows go on, and it is tried again after HOLD_SECONDS — mending the relay's settings or the
broker is what releases it, not the row. An outage is neither: the batch rolls back and is tried
again.
"""
from __future__ import annotations

import logging
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from psycopg import Connection, sql

from taskherd import contract
from taskherd.contract import broker_kind

from . import celery_json
from .components import MAX_SECONDS, is_seconds, is_whole
from .idempotency.claim import validate_seconds
from .profile import REDIS_TRANSPORT_DEFAULTS

logger = logging.getLogger(__name__)

DEFAULT_TABLE = "taskherd_outbox"
#: kombu Redis transport options of the relay's publishes, seconds (CeleryPublisher says why):
#: configure()'s connect timeout, and a read timeout a consuming worker cannot have
REDIS_PUBLISH_TIMEOUTS = {**REDIS_TRANSPORT_DEFAULTS, "socket_timeout": 10.0}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


#: what a table name may be (the commands' --table says the same)
VALID_TABLE = "an unquoted identifier (letters, digits, underscore, at most 63 characters)"


def table_is_valid(table: object) -> bool:
    return isinstance(table, str) and bool(_IDENTIFIER.fullmatch(table))  # match()'s $ takes a last "\n"


def _table(table: str) -> sql.Identifier:
    if not table_is_valid(table):
        raise ValueError(f"outbox table={table!r}; valid: {VALID_TABLE}")
    return sql.Identifier(table)


def _connection(function: str, conn: object) -> None:
    """Refuses a ``conn`` that is not a psycopg Connection, naming its type only: the value may be a
    DSN passed by mistake, with its password."""
    if not isinstance(conn, Connection):
        raise TypeError(f"outbox.{function} conn= got a {type(conn).__name__}; valid: a psycopg (version 3) "
                        "Connection (psycopg.connect(dsn)), not a DSN")


def _name_problem(argument: str, value: str) -> str | None:
    """Why ``value`` (a non-empty str) cannot be a task or queue name PostgreSQL stores and a broker
    routes, or None: checked before the INSERT, which would fail the caller's transaction."""
    if "\x00" in value:
        return f"{argument}={contract.shown(value)} contains NUL (\\x00), which PostgreSQL text cannot hold"
    if not value.strip():
        return f"{argument}={contract.shown(value)} is only whitespace"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{argument}={contract.shown(value)} cannot be encoded in UTF-8 ({exc.reason} at {exc.start})"
    return None


def create_table(conn, *, table: str = DEFAULT_TABLE) -> None:
    """Creates the outbox table and its pending-rows index if missing (safe on every start)."""
    _connection("create_table", conn)
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
                relayed_by  text,
                refused     text
            )""").format(t=t))
        add_missing_columns(conn, table=table)
        conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (created_at) WHERE sent_at IS NULL")
                     .format(i=sql.Identifier(f"{table}_pending"), t=t))


def has_refused_column(conn, *, table: str = DEFAULT_TABLE) -> bool:
    """Whether ``table`` (as the search path finds it) has the ``refused`` column (taskherd 0.1's
    tables do not)."""
    _connection("has_refused_column", conn)
    return conn.execute("SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                        "AND attname = 'refused' AND NOT attisdropped)",
                        (_table(table).as_string(conn),)).fetchone()[0]


def add_missing_columns(conn, *, table: str = DEFAULT_TABLE) -> None:
    """Adds the ``refused`` column to a table taskherd 0.1 created. Looked up first: ALTER TABLE
    takes a lock that would queue the producers' INSERTs behind it, even when it changes nothing."""
    _connection("add_missing_columns", conn)
    with conn.transaction():  # not an implicit one: the relay's own transactions would nest in it
        if not has_refused_column(conn, table=table):
            conn.execute(sql.SQL("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS refused text").format(t=_table(table)))


def enqueue(conn, task_name: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, *,
            queue: str | None = None, table: str = DEFAULT_TABLE) -> str:
    """Adds a task to the outbox in the caller's current transaction; returns its task id.

    Nothing is published here: the row becomes visible to the relay when the caller commits.
    """
    _connection("enqueue", conn)
    valid_name = "a registered task name (a non-empty str, not only whitespace, without NUL)"
    if not isinstance(task_name, str) or not task_name:
        raise ValueError(f"outbox task_name={contract.shown(task_name)}; valid: {valid_name}")
    problem = _name_problem("task_name", task_name)
    if problem:
        raise ValueError(f"outbox {problem}; valid: {valid_name}")
    problem = queue_problem(queue)
    if problem:
        raise ValueError(f"outbox {problem}")
    problem = queue is not None and _name_problem("queue", queue)
    if problem:
        raise ValueError(f"outbox {problem}; valid: a queue name (a non-empty str, not only whitespace, without NUL, "
                         "not starting with 'amq.'), or None for the task's own routing")
    # Refused before the INSERT: a failed statement would abort the caller's whole transaction.
    args_text, kwargs_text = _arguments_text(args, kwargs)
    task_id = str(uuid.uuid4())
    conn.execute(sql.SQL("INSERT INTO {t} (id, task_name, args, kwargs, queue) "
                         "VALUES (%s, %s, %s::jsonb, %s::jsonb, %s)").format(t=_table(table)),
                 (task_id, task_name, args_text, kwargs_text, queue))
    return task_id


def queue_problem(queue: object) -> str | None:
    """Why no broker takes a message for ``queue`` (None: the task's own routing), or None. On
    either broker the relay's publish fails for these, every time: RabbitMQ refuses a name with
    the reserved prefix 'amq.' (ACCESS_REFUSED) and kombu's Redis transport cannot route to one;
    neither client can send a lone surrogate."""
    if queue is None:
        return None
    valid = "valid: a queue name (a non-empty str, not starting with 'amq.'), or None for the task's own routing"
    if not isinstance(queue, str) or not queue:
        return f"queue={queue!r}; {valid}"
    if queue.startswith("amq."):
        return f"queue={queue!r} has the prefix 'amq.', which RabbitMQ reserves for itself; {valid}"
    try:
        queue.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"queue={queue!r} cannot be encoded in UTF-8 ({exc.reason} at {exc.start}); {valid}"
    return None


def _arguments_text(args: object, kwargs: object) -> tuple[str, str]:
    """args and kwargs as Celery's JSON serializer writes a task's (so `.delay()`'s datetimes,
    Decimals, UUIDs, bytes… reach the task as they would without the outbox), or an error naming
    the argument."""
    if kwargs is None:
        kwargs = {}
    problem = arguments_problem(args, kwargs)
    if problem:
        raise TypeError(f"outbox {problem}")
    return _json_text("args", list(args)), _json_text("kwargs", dict(kwargs))


def arguments_problem(args: object, kwargs: object) -> str | None:
    """Why Celery cannot send a task with these args and kwargs, or None. The types are Celery's own
    rules for a message body: anything else is a message the worker fails (a str would even be
    spread into one argument per character), or one `send_task` refuses."""
    if not isinstance(args, (list, tuple)):
        return (f"args= got a {type(args).__name__}; valid: a list or tuple of the task's "
                "positional arguments (args=[order_id], not args=order_id)")
    if not isinstance(kwargs, Mapping):
        return (f"kwargs= got a {type(kwargs).__name__}; valid: a mapping of the task's "
                "keyword arguments with str keys (kwargs={'order_id': 5}), or None")
    bad_keys = [key for key in kwargs if not isinstance(key, str)]
    if bad_keys:
        return (f"kwargs= has keys {bad_keys[:3]!r} that are not str; valid: a mapping with "
                "str keys (the task's parameter names)")
    return None


def _json_text(argument: str, value: Any) -> str:
    try:
        return celery_json.dumps(value, for_jsonb=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"outbox {argument}= cannot be stored ({exc}); valid: {celery_json.VALID}") from exc


#: older than any row a relay marked: a longer purge window deletes the same nothing, and overflows
#: PostgreSQL's timestamps (now() - 1e12 s: "timestamp out of range")
_PURGE_HORIZON_SECONDS = 1e11  # about 3000 years


def purge_sent(conn, *, older_than_seconds: float, table: str = DEFAULT_TABLE) -> int:
    """Deletes rows sent longer ago than the window you want to keep for auditing (0: every sent row).
    A window that is not a finite number >= 0 is refused before any statement: -1 once deleted the
    rows sent a moment ago."""
    _connection("purge_sent", conn)
    seconds = validate_seconds("outbox.purge_sent", "older_than_seconds", older_than_seconds, 0)
    t = _table(table)
    with conn.transaction():
        return conn.execute(sql.SQL("DELETE FROM {t} WHERE sent_at < now() - make_interval(secs => %s)")
                            .format(t=t), (min(seconds, _PURGE_HORIZON_SECONDS),)).rowcount


class Status(NamedTuple):
    pending: int  #: rows waiting for a relay
    oldest_age_seconds: float  #: of the oldest of them (0 when none)
    refused: int  #: rows set aside by a relay (their `refused` column says why)
    refused_examples: list[tuple[str, str]]  #: (id, why) of the oldest few


def status(conn, *, table: str = DEFAULT_TABLE, examples: int = 5) -> Status:
    """What waits in ``table``: rows pending for a relay, and rows a relay set aside (the ids and
    reasons of the oldest ``examples`` of them)."""
    _connection("status", conn)
    if not is_whole(examples) or examples < 0:
        raise ValueError(f"outbox.status examples={contract.shown(examples)}; valid: an int >= 0")
    t = _table(table)
    can_refuse = has_refused_column(conn, table=table)  # taskherd 0.1's tables cannot
    pending, oldest = conn.execute(sql.SQL(
        "SELECT count(*), extract(epoch FROM now() - min(created_at)) FROM {t} WHERE sent_at IS NULL"
        + (" AND refused IS NULL" if can_refuse else "")).format(t=t)).fetchone()
    count, refused = 0, []
    if can_refuse:
        count = conn.execute(sql.SQL("SELECT count(*) FROM {t} WHERE refused IS NOT NULL").format(t=t)).fetchone()[0]
        refused = [(str(row_id), why) for row_id, why in conn.execute(sql.SQL(
            "SELECT id, refused FROM {t} WHERE refused IS NOT NULL ORDER BY created_at LIMIT %s").format(t=t),
            (examples,))]
    return Status(pending, float(oldest or 0), count, refused)


@dataclass(frozen=True)
class OutboxRow:
    id: str
    task_name: str
    args: list
    kwargs: dict
    queue: str | None


class UnrelayableRow(ValueError):
    """A row no relay can turn into a task message; the message says why."""


def row_of(record: Sequence[Any]) -> OutboxRow:
    """The row of ``(id, task_name, args text, kwargs text, queue)`` as the relay publishes it, or
    :class:`UnrelayableRow`. enqueue() writes only rows that pass; this catches the others."""
    row_id, task_name, args_text, kwargs_text, queue = record
    if not isinstance(task_name, str) or not task_name:
        raise UnrelayableRow(f"task_name={task_name!r}; valid: a registered task name")
    problem = queue_problem(queue)
    if problem:
        raise UnrelayableRow(problem)
    decoded = []
    for column, text in (("args", args_text), ("kwargs", kwargs_text)):
        try:
            decoded.append(celery_json.loads(text))
        except Exception as exc:  # noqa: BLE001 - kombu's typed values raise ValueError, decimal's own…
            raise UnrelayableRow(f"{column}={text[:200]!r} cannot be read by Celery's JSON serializer "
                                 f"({type(exc).__name__}: {exc}); valid: {celery_json.VALID}") from None
    args, kwargs = decoded
    problem = arguments_problem(args, kwargs)
    if problem:
        raise UnrelayableRow(problem)
    return OutboxRow(str(row_id), task_name, args, kwargs, queue)


#: how long a queue the broker refused to this relay is held before its rows are tried again
HOLD_SECONDS = 30.0


class RowRefused(Exception):
    """``rows[index]`` of a publish was refused, the rows before it were published, those after it
    were not. ``unsendable``: the row itself cannot be sent (set it aside); otherwise the broker
    refused its queue to this relay (hold the queue, not the row)."""

    def __init__(self, index: int, reason: str, *, unsendable: bool) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason
        self.unsendable = unsendable


def refusal_of(exc: BaseException) -> str | None:
    """'unsendable' when the row cannot be sent by this client at all (a queue name py-amqp cannot
    pack, over 255 bytes: struct.error, or encode); 'queue' when the broker refused the row's queue
    (RabbitMQ closing the channel: 406 a queue declared with other arguments, 403 not permitted,
    404, 405 another connection's exclusive queue — the connection stays up; Redis: a WRONGTYPE
    reply, the queue's key holds something else); None for anything else, an outage or a nack,
    which the batch's retry is for."""
    from amqp.exceptions import ChannelError

    for cause in _causes(exc):  # kombu wraps what the client raised (OperationalError from …)
        if isinstance(cause, (struct.error, UnicodeError)):
            return "unsendable"
        if isinstance(cause, ChannelError) or (type(cause).__name__ == "ResponseError" and "WRONGTYPE" in str(cause)):
            return "queue"
    return None


def _causes(exc: BaseException | None) -> Iterable[BaseException]:
    seen = 0
    while exc is not None and seen < 10:
        yield exc
        exc, seen = exc.__cause__, seen + 1  # raised "from" it; not __context__, any error met meanwhile


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
            for index, row in enumerate(rows):
                options = {"queue": row.queue} if row.queue else {}
                try:
                    self.app.send_task(row.task_name, args=row.args, kwargs=row.kwargs, task_id=row.id,
                                       producer=producer, **options)
                except Exception as exc:
                    refusal = refusal_of(exc)
                    if refusal is None:
                        raise
                    raise RowRefused(index, f"{type(exc).__name__}: {exc}", unsendable=refusal == "unsendable") from exc


class Batch(NamedTuple):
    relayed: int  #: rows published and marked sent
    refused: int  #: rows set aside (UnrelayableRow, RowRefused)
    left: int = 0  #: rows behind a row the broker refused, left pending for the next batch


#: the most rows a relay takes in one transaction (the command's --batch-size says the same)
MAX_BATCH_SIZE = 10_000


@dataclass
class Relay:
    #: returns a new psycopg connection (called again after a connection error)
    connect: Callable[[], Any]
    #: publishes a batch; must raise if any row was not accepted by the broker: RowRefused when
    #: a row was refused (the rows before it published, those after it not)
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
        # The bounds of the command's --batch-size and --poll-interval (taskherd.commands.outbox).
        if not is_whole(self.batch_size) or not 1 <= self.batch_size <= MAX_BATCH_SIZE:
            raise ValueError(f"outbox relay batch_size={contract.shown(self.batch_size)}; "
                             f"valid: an integer in 1..{MAX_BATCH_SIZE}")
        # inf or 1e10 made run()'s first idle wait raise OverflowError (threading's waits)
        if not (is_seconds(self.poll_interval_seconds) and 0 < self.poll_interval_seconds <= MAX_SECONDS):
            raise ValueError(f"outbox relay poll_interval_seconds={contract.shown(self.poll_interval_seconds)}; "
                             f"valid: {contract.seconds_valid()}")
        for name in ("connect", "publish"):
            if not callable(getattr(self, name)):
                raise TypeError(f"outbox relay {name}= got a {type(getattr(self, name)).__name__}; valid: a callable")
        if self.after_publish is not None and not callable(self.after_publish):
            raise TypeError(f"outbox relay after_publish= got a {type(self.after_publish).__name__}; "
                            "valid: a callable, or None")
        if not isinstance(self.name, str) or not self.name.strip() or "\x00" in self.name:
            raise ValueError(f"outbox relay name={contract.shown(self.name)}; valid: a non-empty str without NUL "
                             "(it is written to the relayed_by column)")
        self._t = _table(self.table)
        self._conn = None
        #: queue (None: the task's own routing) -> (monotonic time it is tried again, the refusal)
        self._held: dict[str | None, tuple[float, str]] = {}
        #: what the broker raised for the first queue held in this run (run(once=True) raises it)
        self._first_refusal: BaseException | None = None

    def relay_batch(self) -> Batch:
        """One transaction: lock up to batch_size pending rows, publish them, mark them sent (and set
        aside the rows that cannot be published, saying why in their `refused` column)."""
        if self._conn is None or self._conn.closed:
            self._conn = self.connect()
            add_missing_columns(self._conn, table=self.table)
        conn = self._conn
        with conn.transaction():
            # args and kwargs as text, for Celery's JSON decoder: kombu's typed values (a datetime…)
            # become what the producer passed, not the dicts that encode them.
            not_held, held = self._not_held()
            records = conn.execute(sql.SQL(
                "SELECT id, task_name, args::text, kwargs::text, queue FROM {t} WHERE sent_at IS NULL "
                "AND refused IS NULL{not_held} ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED").format(
                t=self._t, not_held=not_held), (*held, self.batch_size)).fetchall()
            rows, refused, left = [], [], 0
            for record in records:
                try:
                    rows.append(row_of(record))
                except UnrelayableRow as exc:
                    refused.append((record[0], str(exc)))
            if rows:
                try:
                    self.publish(rows)
                except RowRefused as exc:  # the rows behind it wait for the next batch
                    if exc.unsendable:
                        refused.append((rows[exc.index].id, f"this relay cannot send it: {exc.reason}"))
                    else:
                        self._hold(rows[exc.index].queue, exc.reason)
                        self._first_refusal = self._first_refusal or exc.__cause__ or exc
                    left = len(rows) - exc.index - (1 if exc.unsendable else 0)
                    rows = rows[:exc.index]
                if rows and self.after_publish is not None:
                    self.after_publish(rows)
            if refused:
                # Set aside in this transaction: a row that fails every publish would otherwise stop
                # its whole batch, and every row behind it, for good.
                conn.cursor().executemany(sql.SQL("UPDATE {t} SET refused = %s, relayed_by = %s WHERE id = %s")
                                          .format(t=self._t), [(why, self.name, row_id) for row_id, why in refused])
            if rows:
                conn.execute(sql.SQL("UPDATE {t} SET sent_at = clock_timestamp(), relayed_by = %s WHERE id = ANY(%s)")
                             .format(t=self._t), (self.name, [row.id for row in rows]))
        for row_id, why in refused:
            logger.error("outbox relay %s: row %s of %s cannot be published and is set aside (its refused column "
                         "says why; fix the row and set refused = NULL to relay it): %s",
                         self.name, row_id, self.table, why)
        return Batch(relayed=len(rows), refused=len(refused), left=left)

    def _not_held(self) -> tuple[sql.Composable, list]:
        """The SELECT's condition leaving out the rows of held queues, and its parameters; holds
        whose time is up are dropped (their queue is tried again)."""
        now = time.monotonic()
        self._held = {queue: hold for queue, hold in self._held.items() if hold[0] > now}
        named = [queue for queue in self._held if queue is not None]
        condition = []
        if None in self._held:
            condition.append(sql.SQL(" AND queue IS NOT NULL"))
        if named:
            condition.append(sql.SQL(" AND (queue IS NULL OR queue <> ALL(%s))"))
        return sql.Composed(condition), ([named] if named else [])

    def _hold(self, queue: str | None, reason: str) -> None:
        self._held[queue] = (time.monotonic() + HOLD_SECONDS, reason)
        logger.error("outbox relay %s: the broker refused queue %s; its rows wait, the other queues' rows go on, "
                     "and it is tried again in %gs (mend the relay's settings — e.g. --app, for the queue's "
                     "arguments — or the broker): %s", self.name,
                     repr(queue) if queue is not None else "(the task's own routing)", HOLD_SECONDS, reason)

    def run(self, *, once: bool = False, stop: threading.Event | None = None) -> int:
        """Relays until `stop` is set (or, with `once`, until nothing is pending but the rows of
        queues the broker refused: then, the others relayed, what the broker said is raised);
        returns rows relayed."""
        stop = stop or threading.Event()
        total = 0
        self._first_refusal = None
        while not stop.is_set():
            started = time.monotonic()
            try:
                batch = self.relay_batch()
            except Exception:
                # Broker or database unreachable: the batch rolled back, nothing is lost; try again later.
                self._close()
                if once:
                    raise  # the command says why, in one line
                logger.exception("outbox relay %s: batch failed, retrying in %ss", self.name, self.poll_interval_seconds)
                stop.wait(self.poll_interval_seconds)
                continue
            total += batch.relayed
            if batch.relayed:
                logger.info("outbox relay %s: relayed %d rows in %.3fs (total %d)",
                            self.name, batch.relayed, time.monotonic() - started, total)
            if not batch.left and batch.relayed + batch.refused < self.batch_size:
                if once:
                    break
                stop.wait(self.poll_interval_seconds)
        self._close()
        if once and self._first_refusal is not None:
            raise self._first_refusal  # the command says what the broker refused, in one line
        return total

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
