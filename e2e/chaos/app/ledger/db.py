"""The ledger's PostgreSQL tables, one connection per process, and the attempts recorder.

- `ledger_effects`: one row per key, **UNIQUE** — the effect of the tasks guarded by the
  PostgreSQL store. A second application of a key cannot add a row; it is recorded instead in
- `ledger_duplicates`: one row per application of a key that already had its effect. The
  idempotency guard must keep this table empty; the checker reads it.
- `ledger_attempts`: one row per start of a task (committed before the body runs, so an attempt
  killed under its worker stays unfinished), completed with its outcome when the task ends.

The tasks guarded by the Redis store apply their effect to that Redis instead (an RPUSH committed
with the done record, `EFFECTS_LIST`); a key listed twice there is a duplicate.
"""
from __future__ import annotations

import logging
import os
import socket
import time

import psycopg
from celery import signals

from taskherd.worker.idempotency import PostgresStore

log = logging.getLogger(__name__)

#: the list on the store's Redis that the Redis-guarded effects append to ("key|pod|time")
EFFECTS_LIST = "ledger:effects"
#: the PostgreSQL store's key table, beside the effects
store = PostgresStore(table="ledger_idempotency")

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_effects (
    key         text PRIMARY KEY,
    pod         text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS ledger_duplicates (
    id          bigserial PRIMARY KEY,
    key         text NOT NULL,
    pod         text NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS ledger_attempts (
    id          bigserial PRIMARY KEY,
    task_id     text NOT NULL,
    key         text NOT NULL,
    pod         text NOT NULL,
    pid         integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    outcome     text
);
CREATE INDEX IF NOT EXISTS ledger_attempts_key ON ledger_attempts (key);
"""

_connections: dict[int, psycopg.Connection] = {}


def dsn() -> str:
    value = os.environ.get("LEDGER_DATABASE_URL", "")
    if not value:
        raise RuntimeError("LEDGER_DATABASE_URL is not set: the PostgreSQL DSN of the ledger database")
    return value


def connection() -> psycopg.Connection:
    """This process's connection (a prefork child must not share its parent's socket); a broken one
    is replaced, so the first task after a database restart reconnects."""
    pid = os.getpid()
    conn = _connections.get(pid)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(dsn(), autocommit=True, connect_timeout=5)
        _connections[pid] = conn
    return conn


def create_schema(conn: psycopg.Connection) -> None:
    """Creates every table the ledger and the outbox need (a migration step, run before workers)."""
    from taskherd.worker import outbox

    with conn.transaction():
        conn.execute(SCHEMA)
    store.create_table(conn)
    outbox.create_table(conn)


def pod_name() -> str:
    return os.environ.get("POD_NAME") or socket.gethostname()


def apply_effect(conn: psycopg.Connection, key: str) -> None:
    """Inside the guard's transaction: the effect row, or — if the key already has one, which the
    guard exists to prevent — a duplicate row committed with the key instead."""
    inserted = conn.execute("INSERT INTO ledger_effects (key, pod) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING "
                            "RETURNING key", (key, pod_name())).fetchone()
    if inserted is None:
        log.error("ledger: key %s applied a second time", key)
        conn.execute("INSERT INTO ledger_duplicates (key, pod) VALUES (%s, %s)", (key, pod_name()))


# --- attempts ------------------------------------------------------------------------------------
# Recording is best effort: while PostgreSQL is down (a chaos fault) an attempt row cannot be
# written, and the task must not fail for it. The checker's verdict rests on effects and the DLQ;
# attempts give the histogram and tell recovered tasks apart.

def _record(sql: str, params: tuple) -> int | None:
    try:
        row = connection().execute(sql, params).fetchone()
        return row[0] if row else None
    except psycopg.Error as exc:
        log.warning("ledger: attempt not recorded (%s)", exc)
        return None


@signals.task_prerun.connect
def _attempt_started(task_id=None, task=None, kwargs=None, **_):
    key = (kwargs or {}).get("key")
    if key is None:
        return
    task.request.ledger_attempt = _record(
        "INSERT INTO ledger_attempts (task_id, key, pod, pid) VALUES (%s, %s, %s, %s) RETURNING id",
        (task_id, str(key), pod_name(), os.getpid()))
    task.request.ledger_started = time.monotonic()


@signals.task_postrun.connect
def _attempt_ended(task=None, state=None, **_):
    attempt = getattr(task.request, "ledger_attempt", None)
    if attempt is not None:
        _record("UPDATE ledger_attempts SET finished_at = clock_timestamp(), outcome = %s WHERE id = %s RETURNING id",
                (state, attempt))
