"""The mailer's PostgreSQL table and connections (`MAILER_DATABASE_URL`, from a Secret)."""
from __future__ import annotations

import os

import psycopg

from taskherd.worker.idempotency import PostgresStore

#: the idempotency keys, committed in the same transaction as the mail they stand for
keys = PostgresStore(table="mailer_idempotency")

# No unique constraint on user_id, on purpose: the idempotency key is what keeps a welcome mail
# from going out twice, and `python3 -m mailer.check` counts the rows to show it.
SCHEMA = """
CREATE TABLE IF NOT EXISTS mailer_sent (
    user_id  text NOT NULL,
    pod      text NOT NULL,
    sent_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def connect() -> psycopg.Connection:
    dsn = os.environ.get("MAILER_DATABASE_URL", "")
    if not dsn:
        raise RuntimeError("MAILER_DATABASE_URL is not set: the PostgreSQL DSN of the mailer's database")
    return psycopg.connect(dsn, connect_timeout=10)


def migrate() -> None:
    """Creates the tables; every worker runs it at start, the advisory lock serialises them."""
    with connect() as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(7107)")
        conn.execute(SCHEMA)
        keys.create_table(conn)
