"""Tables the effects tests read: `attempts` (one row per run) and `ledger` (one row per effect),
and the one PostgreSQL connection per process their worker apps use."""
import os

import psycopg

from taskherd.worker.idempotency import PostgresStore

TABLES = [
    "CREATE TABLE IF NOT EXISTS attempts (task_id text NOT NULL, hostname text NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())",
    # No unique constraint on purpose: a repeated effect must show up as a second row.
    "CREATE TABLE IF NOT EXISTS ledger (key text NOT NULL, who text NOT NULL, "
    "at timestamptz NOT NULL DEFAULT clock_timestamp())",
]


def create_tables(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        PostgresStore().create_table(conn)
        for ddl in TABLES:
            conn.execute(ddl)


_connections: dict[tuple[int, str], psycopg.Connection] = {}


def process_connection(dsn: str) -> psycopg.Connection:
    """One autocommit connection per process (a prefork child never shares its parent's)."""
    key = (os.getpid(), dsn)
    conn = _connections.get(key)
    if conn is None or conn.closed:
        conn = _connections[key] = psycopg.connect(dsn, autocommit=True)
    return conn
