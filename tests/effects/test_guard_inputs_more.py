"""More bad input to the idempotency guard: each refused with an error naming it, nothing lost, and the
caller's PostgreSQL transaction never left broken by taskherd."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest
import redis
from celery import Celery

from taskherd.worker.idempotency import InProgress, InvalidKey, PostgresStore, RedisStore, idempotent

from .test_worker_sigkill import rows


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def ledger(dsn: str, key: str) -> list[str]:
    return [who for (who,) in rows(dsn, f"SELECT who FROM ledger WHERE key = '{key}' ORDER BY at")]


def keys(dsn: str) -> list[tuple]:
    return rows(dsn, "SELECT key, result FROM taskherd_idempotency ORDER BY key")


# --- D1: a result PostgreSQL cannot hold, and any failing statement of the guard ----------------------

@pytest.mark.parametrize("result", ["\udfff", {"k\ud800": 1}, ["\ud83d\ude00"]])
def test_an_unstorable_result_inside_the_callers_transaction_is_the_documented_type_error(ledger_dsn, result):
    store = PostgresStore()
    with psycopg.connect(ledger_dsn) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO ledger (key, who) VALUES ('order:1', 'caller')")
            with pytest.raises(TypeError, match=r"idempotency key 'sur:1' \(PostgresStore\): the result, a .*cannot "
                                                r"be stored \(a str holds the surrogate code point.*rolled back with "
                                                r"the key to the guard's savepoint; the caller's transaction goes on"):
                with store.guard("sur:1", conn=conn) as claim:
                    conn.execute("INSERT INTO ledger (key, who) VALUES ('sur:1', 'effect')")
                    claim.set_result(result)
            conn.execute("INSERT INTO ledger (key, who) VALUES ('order:1', 'after')")  # still usable
    assert ledger(ledger_dsn, "order:1") == ["caller", "after"]
    assert ledger(ledger_dsn, "sur:1") == [] and keys(ledger_dsn) == []


def test_an_unstorable_result_in_the_guards_own_transaction_is_the_documented_type_error(ledger_dsn):
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        with pytest.raises(TypeError, match=r"idempotency key 'sur:2' \(PostgresStore\).*surrogate.*nothing was "
                                            r"committed"):
            with PostgresStore().guard("sur:2", conn=conn) as claim:
                conn.execute("INSERT INTO ledger (key, who) VALUES ('sur:2', 'effect')")
                claim.set_result("\ud800")
    assert ledger(ledger_dsn, "sur:2") == [] and keys(ledger_dsn) == []


def test_a_failing_statement_of_the_guard_after_the_body_rolls_back_to_its_savepoint(ledger_dsn):
    """The UPDATE writing the result fails on the server (here a CHECK the table's owner added):
    the database's error as it is, the effect undone, the caller's transaction going on."""
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE taskherd_idempotency ADD CONSTRAINT no_strings "
                     "CHECK (result IS NULL OR jsonb_typeof(result) <> 'string')")
    store = PostgresStore()
    with psycopg.connect(ledger_dsn) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO ledger (key, who) VALUES ('order:3', 'caller')")
            with pytest.raises(psycopg.errors.CheckViolation, match="no_strings"):
                with store.guard("chk:3", conn=conn) as claim:
                    conn.execute("INSERT INTO ledger (key, who) VALUES ('chk:3', 'effect')")
                    claim.set_result("a string")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            with store.guard("chk:3", conn=conn) as claim:  # the key was rolled back: runs again
                assert not claim.done
                conn.execute("INSERT INTO ledger (key, who) VALUES ('chk:3', 'second')")
                claim.set_result({"ok": 1})
    assert ledger(ledger_dsn, "order:3") == ["caller"] and ledger(ledger_dsn, "chk:3") == ["second"]


def test_a_result_the_databases_encoding_cannot_hold_is_the_documented_type_error(pg_dsn):
    """A LATIN1 database refuses '€' in the UPDATE (a server-side encoding error): TypeError naming
    the key, rolled back to the savepoint, the caller's transaction going on."""
    name = f"latin1_{int(time.time() * 1000) % 10**9}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            PostgresStore().create_table(conn)
            conn.execute("CREATE TABLE ledger (key text, who text)")
        with psycopg.connect(dsn) as conn:
            conn.execute("SET client_encoding TO 'UTF8'")
            conn.commit()
            with conn.transaction():
                conn.execute("INSERT INTO ledger VALUES ('order:4', 'caller')")
                with pytest.raises(TypeError, match=r"idempotency key 'enc:4' \(PostgresStore\): the result, a str, "
                                                    r"cannot be stored.*the caller's transaction goes on"):
                    with PostgresStore().guard("enc:4", conn=conn) as claim:
                        conn.execute("INSERT INTO ledger VALUES ('enc:4', 'effect')")
                        claim.set_result("10 €")
                conn.execute("INSERT INTO ledger VALUES ('order:4', 'after')")
            assert [r[0] for r in conn.execute("SELECT who FROM ledger ORDER BY who")] == ["after", "caller"]
            assert conn.execute("SELECT count(*) FROM taskherd_idempotency").fetchone() == (0,)
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --- D3: a guard of a key this transaction already holds in progress ------------------------------------

@pytest.mark.parametrize("caller_transaction", [True, False])
def test_a_nested_guard_of_the_same_key_on_one_connection_raises_in_progress(ledger_dsn, caller_transaction):
    store = PostgresStore()
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        with conn.transaction() if caller_transaction else _nothing():
            with store.guard("nest:1", conn=conn) as outer:
                assert not outer.done
                with pytest.raises(InProgress, match=r"idempotency key 'nest:1' is in progress \(an enclosing guard "
                                                     r"of this key, in this same transaction"):
                    with store.guard("nest:1", conn=conn):
                        conn.execute("INSERT INTO ledger (key, who) VALUES ('nest:1', 'inner')")
                conn.execute("INSERT INTO ledger (key, who) VALUES ('nest:1', 'outer')")  # still usable
                outer.set_result("o")
        with store.guard("nest:1", conn=conn) as again:
            assert (again.done, again.result) == (True, "o")
    assert ledger(ledger_dsn, "nest:1") == ["outer"]


def test_nested_decorators_of_the_same_key_do_not_skip_the_inner_body_silently(ledger_dsn):
    store = PostgresStore()
    conn = psycopg.connect(ledger_dsn, autocommit=True)
    try:
        @idempotent(store, key=lambda n: f"dec:{n}", connection=lambda n: conn)
        def inner(n):
            conn.execute("INSERT INTO ledger (key, who) VALUES (%s, 'inner')", (f"dec:{n}",))
            return "inner"

        @idempotent(store, key=lambda n: f"dec:{n}", connection=lambda n: conn)
        def outer(n):
            return inner(n)

        with pytest.raises(InProgress, match="'dec:1'"):
            outer(1)
    finally:
        conn.close()
    assert ledger(ledger_dsn, "dec:1") == [] and keys(ledger_dsn) == []


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# --- D4: @idempotent above @app.task ------------------------------------------------------------------------

def test_idempotent_above_app_task_is_refused_at_decoration(redis_client):
    store = RedisStore(client=redis_client)
    app = Celery("guard-inputs", set_as_current=False)

    def charge(order_id):
        return order_id

    lazy = app.task(name="t.charge")(charge)        # a lazy proxy, before the app is finalized
    with pytest.raises(TypeError, match=r"idempotent\(...\) got a Celery task.*put @idempotent under @app.task"):
        idempotent(store, key=lambda order_id: f"c:{order_id}")(lazy)
    app.finalize()
    task = app.tasks["t.charge"]
    with pytest.raises(TypeError, match=r"got a Celery task 't.charge'.*valid: put @idempotent under @app.task"):
        idempotent(store, key=lambda order_id: f"c:{order_id}")(task)
    # the right order still works
    guarded = app.task(name="t.guarded")(idempotent(store, key=lambda order_id: f"c:{order_id}")(charge))
    assert guarded.apply(args=(5,)).get() == 5 and guarded.apply(args=(5,)).get() == 5


# --- D5: set_result after the guard ended ------------------------------------------------------------------

def test_set_result_after_the_guard_ended_is_refused_naming_the_key(redis_client, ledger_dsn):
    rstore = RedisStore(client=redis_client)
    with rstore.guard("late:r") as claim:
        claim.set_result("first")
        claim.set_result("last")  # documented: the last value is the one stored
    with pytest.raises(RuntimeError, match=r"idempotency key 'late:r': claim.set_result\(...\) after the guard ended"):
        claim.set_result("too late")
    with pytest.raises(RuntimeError, match=r"'late:r': claim.in_transaction\(...\) after the guard ended"):
        claim.in_transaction(lambda pipe: pipe.rpush("ledger", "x"))
    with rstore.guard("late:r") as again:
        assert again.result == "last"
    assert redis_client.llen("ledger") == 0

    with pytest.raises(ValueError):
        with rstore.guard("late:failed") as failed:
            raise ValueError("body")
    with pytest.raises(RuntimeError, match="'late:failed'.*after the guard ended"):
        failed.set_result(1)

    pstore = PostgresStore()
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        for outer in (False, True):
            key = f"late:p{int(outer)}"
            with conn.transaction() if outer else _nothing():
                with pstore.guard(key, conn=conn) as claim:
                    claim.set_result("first")
                    claim.set_result("last")
                with pytest.raises(RuntimeError, match=f"idempotency key '{key}': claim.set_result.*after the guard"):
                    claim.set_result("too late")
            with pstore.guard(key, conn=conn) as again:
                assert again.result == "last"


# --- D11: the longest documented lease ---------------------------------------------------------------------

def test_the_longest_documented_lease_keeps_the_renewer_alive(redis_client):
    died: list = []
    previous = threading.excepthook
    threading.excepthook = lambda args: died.append(args.exc_value)
    try:
        store = RedisStore(client=redis_client, lease_seconds=1e15, result_ttl_seconds=1e15)
        with store.guard("long:1") as claim:
            time.sleep(0.3)  # the renewer thread has started and chosen its wait
            claim.set_result(1)
        assert store._renewer._thread.is_alive() and died == []
        # a renewal itself (due in 3e14 s) runs on a socket timeout it can set
        assert store._renew(keys=["long:none"], args=["not ours", 1000]) == 0
        with store.guard("long:1") as again:
            assert again.result == 1
    finally:
        threading.excepthook = previous


# --- D12: a key that is not Unicode text -------------------------------------------------------------------

def test_a_key_with_a_surrogate_is_an_invalid_key_in_both_stores_and_from_a_key_function(redis_client, ledger_dsn):
    expected = r"idempotency key 'sur\\ud800' holds the surrogate code point \\ud800.*valid: a str of 1..512"
    rstore = RedisStore(client=redis_client)
    with pytest.raises(InvalidKey, match=expected):
        with rstore.guard("sur\ud800"):
            pass
    with pytest.raises(InvalidKey, match=expected):
        idempotent(rstore, key=lambda n: f"sur{n}")(lambda n: n)("\ud800")
    assert redis_client.dbsize() == 0
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO ledger (key, who) VALUES ('order:12', 'caller')")
            with pytest.raises(InvalidKey, match=expected):
                with PostgresStore().guard("sur\ud800", conn=conn):
                    pass
            with pytest.raises(InvalidKey, match=expected):
                idempotent(PostgresStore(), key=lambda n: f"sur{n}", connection=lambda n: conn)(lambda n: n)("\ud800")
    assert ledger(ledger_dsn, "order:12") == ["caller"] and keys(ledger_dsn) == []


# --- D17: a queuing function that raises -------------------------------------------------------------------

def test_a_queuing_function_that_raises_releases_the_key_at_once(redis_client):
    store = RedisStore(client=redis_client, lease_seconds=60)
    with pytest.raises(ZeroDivisionError):
        with store.guard("queue:1") as claim:
            claim.in_transaction(lambda pipe: pipe.rpush("ledger", "applied"))
            claim.in_transaction(lambda pipe: 1 / 0)
            claim.set_result(1)
    assert store.state("queue:1") is None and redis_client.llen("ledger") == 0
    with store.guard("queue:1") as retry:  # not InProgress for the 60 s lease
        assert not retry.done
        retry.in_transaction(lambda pipe: pipe.rpush("ledger", "applied"))
        retry.set_result(2)
    assert redis_client.lrange("ledger", 0, -1) == [b"applied"] and store.state("queue:1")["state"] == "done"
