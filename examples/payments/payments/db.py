"""The service's PostgreSQL tables and connections (`PAYMENTS_DATABASE_URL`, from a Secret)."""
from __future__ import annotations

import os

import psycopg

from taskherd.worker.idempotency import PostgresStore

#: the idempotency keys, in the service's own table, committed with each effect
store = PostgresStore(table="payments_idempotency")

SCHEMA = """
CREATE TABLE IF NOT EXISTS payments_captures (
    payment_id    text NOT NULL,
    amount_cents  integer NOT NULL,
    pod           text NOT NULL,
    captured_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS payments_refunds (
    payment_id    text NOT NULL,
    refunded_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""
# No unique constraint on payment_id, on purpose: the idempotency key is what keeps a capture from
# being recorded twice, and `python -m payments.check` counts rows to show it.


def connect() -> psycopg.Connection:
    dsn = os.environ.get("PAYMENTS_DATABASE_URL", "")
    if not dsn:
        raise RuntimeError("PAYMENTS_DATABASE_URL is not set: the PostgreSQL DSN of the payments database")
    return psycopg.connect(dsn, connect_timeout=10)


def migrate() -> None:
    """Creates the tables (every worker runs it at start; the advisory lock serialises them)."""
    with connect() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(4242)")
        conn.execute(SCHEMA)
        store.create_table(conn)
