"""PostgreSQL store: the key row lives in the same transaction as the user's effect.

`guard(key, conn=conn)` opens `conn.transaction()` (a real transaction, or a savepoint when the
caller already has one open) and inserts the key with `INSERT … ON CONFLICT DO NOTHING`:

- inserted: the body runs the effect on the same connection; at the end the result is written to
  the key row and the transaction commits (or, inside the caller's transaction, the caller's
  commit makes both visible). An exception rolls back the key and the effect together.
- conflict with a committed row: done; the body gets the stored result and must not run the effect.
- conflict with an uncommitted row (a concurrent duplicate): PostgreSQL makes the INSERT wait for
  that transaction; if it commits, this is "done", if it rolls back (or its connection dies), the
  INSERT succeeds and this holder runs the effect. No lease: the database is the lease.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator

from psycopg import sql
from psycopg.types.json import Jsonb

from .claim import Claim, validate_key

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class PostgresStore:
    def __init__(self, *, table: str = "taskherd_idempotency"):
        if not _IDENTIFIER.match(table):
            raise ValueError(f"PostgresStore table={table!r}; valid: an unquoted identifier "
                             "(letters, digits, underscore, at most 63 characters)")
        #: the table holding one row per key (create it with `create_table`)
        self.table = table
        self._t = sql.Identifier(table)

    def create_table(self, conn) -> None:
        """Creates the key table if it does not exist (safe to run on every start)."""
        with conn.transaction():
            conn.execute(sql.SQL("""
                CREATE TABLE IF NOT EXISTS {t} (
                    key          text PRIMARY KEY,
                    result       jsonb,
                    created_at   timestamptz NOT NULL DEFAULT now(),
                    completed_at timestamptz
                )""").format(t=self._t))

    def purge(self, conn, *, older_than_seconds: float) -> int:
        """Deletes keys older than the window in which a duplicate can still arrive."""
        with conn.transaction():
            cur = conn.execute(sql.SQL("DELETE FROM {t} WHERE created_at < now() - make_interval(secs => %s)")
                               .format(t=self._t), (older_than_seconds,))
            return cur.rowcount

    def is_done(self, conn, key: str) -> bool:
        row = conn.execute(sql.SQL("SELECT 1 FROM {t} WHERE key = %s").format(t=self._t),
                           (validate_key(key),)).fetchone()
        return row is not None

    @contextlib.contextmanager
    def guard(self, key: str, *, conn) -> Iterator[Claim]:
        key = validate_key(key)
        with conn.transaction():
            inserted = conn.execute(
                sql.SQL("INSERT INTO {t} (key) VALUES (%s) ON CONFLICT (key) DO NOTHING RETURNING key")
                .format(t=self._t), (key,)).fetchone()
            if inserted is None:
                row = conn.execute(sql.SQL("SELECT result FROM {t} WHERE key = %s").format(t=self._t),
                                   (key,)).fetchone()
                if row is None:
                    # REPEATABLE READ / SERIALIZABLE: the conflicting row committed after our snapshot.
                    raise RuntimeError(f"idempotency key {key!r} exists but is invisible to this transaction's "
                                       "snapshot: use READ COMMITTED for the guard's transaction")
                yield Claim(key, done=True, result=row[0])
                return
            claim = Claim(key, done=False)
            yield claim
            conn.execute(sql.SQL("UPDATE {t} SET result = %s, completed_at = now() WHERE key = %s")
                         .format(t=self._t), (Jsonb(claim.result), key))
