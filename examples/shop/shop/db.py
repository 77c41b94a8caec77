"""The shop's PostgreSQL tables, one connection per worker process, and the attempts ledger.

`shop_charges` holds the effect. It deliberately has no unique constraint on `charge_id`: the
idempotency guard (`taskherd_idempotency`, written in the same transaction) is what keeps a charge
from being recorded twice, and the demo's ledger check counts rows to prove it.

`shop_attempts` is the demo's flight recorder, not something your app needs: one row per start of
a task (written and committed before the task body runs, so a worker killed mid-task leaves an
unfinished row), completed when the task returns or raises.
"""
from __future__ import annotations

import os
import socket

import psycopg
from celery import signals

from taskherd.worker.idempotency import PostgresStore

#: the idempotency key table, beside the effect tables
store = PostgresStore(table="taskherd_idempotency")

#: task name -> the keyword argument its attempts are recorded under
LEDGER_KEYS: dict[str, str] = {"shop.charge": "charge_id", "shop.build_report": "report_id"}

SCHEMA = """
CREATE TABLE IF NOT EXISTS shop_charges (
    id            bigserial PRIMARY KEY,
    charge_id     text NOT NULL,
    customer      text NOT NULL,
    amount_cents  integer NOT NULL,
    auth_code     text NOT NULL,
    worker        text NOT NULL,
    charged_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS shop_attempts (
    id          bigserial PRIMARY KEY,
    task_id     text NOT NULL,
    task_name   text NOT NULL,
    key         text NOT NULL,
    worker      text NOT NULL,
    pid         integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    outcome     text
);
CREATE INDEX IF NOT EXISTS shop_attempts_task_id ON shop_attempts (task_id);
"""

_connections: dict[int, psycopg.Connection] = {}


def dsn() -> str:
    value = os.environ.get("SHOP_DATABASE_URL", "")
    if not value:
        raise RuntimeError("SHOP_DATABASE_URL is not set: the PostgreSQL DSN of the shop database")
    return value


def connection() -> psycopg.Connection:
    """This process's connection (prefork children must not share the parent's socket)."""
    pid = os.getpid()
    conn = _connections.get(pid)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(dsn(), autocommit=True, connect_timeout=10)
        _connections[pid] = conn
    return conn


def create_schema(conn: psycopg.Connection) -> None:
    """Creates the tables if missing. Run once before the workers start (a migration step)."""
    with conn.transaction():
        conn.execute(SCHEMA)
    store.create_table(conn)


def worker_name(task) -> str:
    """The pod name in Kubernetes (POD_NAME from the chart), else the Celery node name."""
    return os.environ.get("POD_NAME") or (task.request.hostname or socket.gethostname()).split("@")[-1]


def _ledger_key(task, kwargs) -> str | None:
    arg = LEDGER_KEYS.get(task.name)
    return str(kwargs.get(arg)) if arg and kwargs and arg in kwargs else None


@signals.task_prerun.connect
def _record_start(task_id=None, task=None, kwargs=None, **_):
    key = _ledger_key(task, kwargs)
    if key is not None:
        row = connection().execute(
            "INSERT INTO shop_attempts (task_id, task_name, key, worker, pid) VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (task_id, task.name, key, worker_name(task), os.getpid())).fetchone()
        task.request.shop_attempt_id = row[0]


@signals.task_postrun.connect
def _record_end(task=None, state=None, **_):
    attempt_id = getattr(task.request, "shop_attempt_id", None)
    if attempt_id is not None:
        connection().execute("UPDATE shop_attempts SET finished_at = clock_timestamp(), outcome = %s WHERE id = %s",
                             (state, attempt_id))
