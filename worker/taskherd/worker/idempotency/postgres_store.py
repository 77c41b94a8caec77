"""PostgreSQL store: the key row lives in the same transaction as the user's effect.

`guard(key, conn=conn)` inserts the key with `INSERT … ON CONFLICT DO NOTHING`, in a transaction of
its own (`conn.transaction()`) or, when the caller already has one open, inside it behind a
savepoint:

- inserted: the body runs the effect on the same connection; at the end the result is written to
  the key row and the transaction commits (or, inside the caller's transaction, the caller's
  commit makes both visible). An exception rolls back the key and the effect together (to the
  savepoint, inside the caller's transaction, which stays usable).
- conflict with a committed row: done; the body gets the stored result and must not run the effect.
- conflict with an uncommitted row (a concurrent duplicate): PostgreSQL makes the INSERT wait for
  that transaction; if it commits, this is "done", if it rolls back (or its connection dies), the
  INSERT succeeds and this holder runs the effect. No lease: the database is the lease.

A transaction nobody here commits — an implicit one, opened by a statement on a connection with
autocommit off, outside any `conn.transaction()` block — is refused: nested in it the guard would
report success while its key and effect wait, uncommitted, for a commit that may never come.
Results are stored as Celery's JSON serializer writes them (`celery_json`), checked before the
commit: one it cannot encode rolls the effect back with the key and says so.

Inside the caller's transaction the guard adds its two statements and nothing else in round trips:
the savepoint travels with the INSERT, its release with the UPDATE (one simple-protocol query each,
parameters bound client-side by psycopg's ClientCursor), so a guarded effect costs two round trips
more than the effect alone (bench/guard_cost.py).
"""
from __future__ import annotations

import contextlib
import itertools
import re
from typing import Callable, Iterator

import psycopg
from psycopg import ClientCursor, Connection, pq, sql

from .. import celery_json
from .claim import MAX_KEY_LENGTH, Claim, InProgress, InvalidKey, unstorable_result, validate_key, validate_seconds

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: savepoint names of guards opened inside a caller's transaction (nested guards get their own)
_savepoints = itertools.count()


def _connection(method: str, conn: object) -> None:
    # The type only: a DSN passed by mistake would show its password.
    if not isinstance(conn, Connection):
        raise TypeError(f"PostgresStore.{method} conn= got a {type(conn).__name__}; valid: a psycopg "
                        "(version 3) Connection: the one the effect uses, so that the key commits with it")


def _key(key: object) -> str:
    key = validate_key(key)
    if "\x00" in key:
        raise InvalidKey(f"idempotency key {key[:40]!r} contains NUL (\\x00), which PostgreSQL text cannot "
                         f"hold; valid: a str of 1..{MAX_KEY_LENGTH} characters other than NUL")
    return key


def _result_text(claim: Claim, consequence: str) -> str:
    """The claim's result as Celery's JSON serializer writes it, checked before anything commits."""
    try:
        return celery_json.dumps(claim.result, for_jsonb=True)
    except (TypeError, ValueError) as exc:
        raise unstorable_result(claim.key, "PostgresStore", claim.result, exc, consequence) from exc


def _complete(claim: Claim, consequence: str, write: Callable[[], object]) -> None:
    """Writes the result (`write`). The server refusing its text (a character the database's
    encoding lacks, say) is the documented TypeError about the result, not a database error."""
    try:
        write()
    except (psycopg.DataError, UnicodeEncodeError) as exc:
        raise unstorable_result(claim.key, "PostgresStore", claim.result, exc, consequence) from exc


def _refuse_an_uncommitted_transaction(key: str, conn: Connection) -> None:
    """An implicit transaction (autocommit off, a statement ran before the guard) is nobody's to
    commit: the guard would be a savepoint in it, the task would succeed, and the key and the
    effect would be lost with the connection unless something calls commit() later. A caller's
    `conn.transaction()` block (its exit commits) and an explicit BEGIN on an autocommit connection
    (the caller's own COMMIT) are transactions someone owns: the guard nests in them."""
    # psycopg has no public "inside a transaction() block" (it counts them for its own checks);
    # should the counter go, the guard nests as it did before (tests/effects pins this).
    if conn.autocommit or getattr(conn, "_num_transactions", 1):
        return
    raise RuntimeError(
        f"PostgresStore.guard({key!r}, conn=…): the connection has a transaction open that nothing here commits "
        "(autocommit is off and a statement ran before the guard, outside any `with conn.transaction():`), so "
        "the key and the effect would stay uncommitted, and be lost unless something calls conn.commit(); "
        "valid: an idle connection (conn.commit() or conn.rollback() first; the guard then commits key and "
        "effect), a guard inside `with conn.transaction():` (its exit commits them), or "
        "psycopg.connect(..., autocommit=True)")


class PostgresStore:
    def __init__(self, *, table: str = "taskherd_idempotency"):
        if not isinstance(table, str) or not _IDENTIFIER.fullmatch(table):
            error = ValueError if isinstance(table, str) else TypeError
            raise error(f"PostgresStore table={table!r}; valid: an unquoted identifier "
                        "(letters, digits, underscore, at most 63 characters)")
        #: the table holding one row per key (create it with `create_table`)
        self.table = table
        self._t = sql.Identifier(table)

    def create_table(self, conn) -> None:
        """Creates the key table if it does not exist (safe to run on every start)."""
        _connection("create_table", conn)
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
        _connection("purge", conn)
        older_than_seconds = validate_seconds("PostgresStore.purge", "older_than_seconds", older_than_seconds, 0)
        with conn.transaction():
            cur = conn.execute(sql.SQL("DELETE FROM {t} WHERE created_at < now() - make_interval(secs => %s)")
                               .format(t=self._t), (older_than_seconds,))
            return cur.rowcount

    def is_done(self, conn, key: str) -> bool:
        _connection("is_done", conn)
        key = _key(key)
        # In a transaction of its own: a bare SELECT with autocommit off would leave an implicit
        # transaction open, which the next guard on this connection refuses.
        with conn.transaction():
            row = conn.execute(sql.SQL("SELECT 1 FROM {t} WHERE key = %s").format(t=self._t), (key,)).fetchone()
        return row is not None

    @contextlib.contextmanager
    def guard(self, key: str, *, conn) -> Iterator[Claim]:
        key = _key(key)
        _connection("guard", conn)
        if conn.info.transaction_status == pq.TransactionStatus.INTRANS:
            _refuse_an_uncommitted_transaction(key, conn)
            with self._inside(key, conn) as claim:
                yield claim
            return
        claim = None
        try:
            with conn.transaction():
                inserted = conn.execute(self._insert(), (key,)).fetchone()
                if inserted is None:
                    claim = Claim(key, done=True, result=self._stored_result(conn, key))
                    yield claim
                    return
                claim = Claim(key, done=False)
                yield claim
                claim._finished = True
                # Raised here, inside the transaction: the effect rolls back with the key.
                consequence = "nothing was committed: the effect was rolled back with the key"
                result = _result_text(claim, consequence)
                _complete(claim, consequence, lambda: conn.execute(self._complete(), (result, key)))
        finally:
            if claim is not None:
                claim._finished = True

    @contextlib.contextmanager
    def _inside(self, key: str, conn) -> Iterator[Claim]:
        """The guard inside the caller's transaction, behind a savepoint sent with its statements.
        Every statement after the savepoint is covered: whatever fails (the body, a statement of the
        guard, the result's encoding) rolls back to the savepoint, and the caller's transaction goes on."""
        savepoint = sql.Identifier(f"taskherd_guard_{next(_savepoints)}")
        cursor = ClientCursor(conn)
        claim = None
        try:
            cursor.execute(sql.SQL("SAVEPOINT {s}; ").format(s=savepoint) + self._insert(), (key,))
            cursor.nextset()  # the INSERT's result, after the SAVEPOINT's
            if cursor.fetchone() is None:
                claim = Claim(key, done=True, result=self._stored_result(conn, key))
            else:
                claim = Claim(key, done=False)
            yield claim
            claim._finished = True
            if claim.done:
                cursor.execute(sql.SQL("RELEASE SAVEPOINT {s}").format(s=savepoint))
            else:
                consequence = ("the effect was rolled back with the key to the guard's savepoint; "
                               "the caller's transaction goes on")
                result = _result_text(claim, consequence)
                _complete(claim, consequence, lambda: cursor.execute(
                    self._complete() + sql.SQL("; RELEASE SAVEPOINT {s}").format(s=savepoint), (result, key)))
        except BaseException:
            if conn.info.transaction_status in (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR):
                try:
                    cursor.execute(sql.SQL("ROLLBACK TO SAVEPOINT {s}; RELEASE SAVEPOINT {s}").format(s=savepoint))
                except psycopg.Error:
                    # No savepoint to go back to (its own statement failed: the caller's transaction
                    # had failed before the guard) or no connection left: the first error says why.
                    pass
            raise
        finally:
            if claim is not None:
                claim._finished = True

    def _insert(self) -> sql.Composed:
        return sql.SQL("INSERT INTO {t} (key) VALUES (%s) ON CONFLICT (key) DO NOTHING RETURNING key").format(t=self._t)

    def _complete(self) -> sql.Composed:
        return sql.SQL("UPDATE {t} SET result = %s::jsonb, completed_at = now() WHERE key = %s").format(t=self._t)

    def _stored_result(self, conn, key: str):
        # As text, for Celery's JSON decoder (psycopg's own would leave kombu's typed values as dicts).
        row = conn.execute(sql.SQL("SELECT result::text, completed_at IS NULL FROM {t} WHERE key = %s")
                           .format(t=self._t), (key,)).fetchone()
        if row is None:
            # REPEATABLE READ / SERIALIZABLE: the conflicting row committed after our snapshot.
            raise RuntimeError(f"idempotency key {key!r} exists but is invisible to this transaction's "
                               "snapshot: use READ COMMITTED for the guard's transaction")
        if row[1]:
            # Every guard completes its row before it commits, and a duplicate's INSERT waits for
            # another transaction's row: a visible row not completed is this transaction's own, of
            # a guard of the same key still running around this one. Its effect has not happened.
            raise InProgress(key, retry_after=0.0, reason=(
                "an enclosing guard of this key, in this same transaction, has not finished its effect; "
                "valid: one guard per key in a transaction (a nested guard, or a nested @idempotent, of the "
                "same key would skip its body as if the effect had happened)"))
        return None if row[0] is None else celery_json.loads(row[0])
