"""Idempotency guard: one effect per key, whatever the number of concurrent deliveries.

Real Redis and PostgreSQL; duplicates as threads in this process and as separate processes.
"""
from __future__ import annotations

import json
import math
import re
import signal
import threading
import time
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal

import psycopg
import pytest
import redis
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st
from kombu.utils import json as kombu_json

from taskherd.worker.idempotency import (InProgress, InvalidKey, PostgresStore, RedisStore, StoreUnavailable,
                                        idempotent)
from taskherd.worker.transient import ErrorClassifier
from taskherd.worker.idempotency.records import Action, decide, done_record, in_progress_record


# --- pure decisions -------------------------------------------------------------------------------

def test_decision_on_each_record_state():
    assert decide(True, None, 0).action is Action.RUN
    busy = decide(False, in_progress_record("host:1"), 2500)
    assert (busy.action, busy.holder, busy.retry_after) == (Action.BUSY, "host:1", 2.5)
    done = decide(False, done_record("host:2", {"charged": 5}), 1000)
    assert (done.action, done.result) == (Action.RETURN, {"charged": 5})
    # A claim re-sent after a lost reply finds its own record: it won the first time.
    mine = in_progress_record("host:3")
    assert decide(False, mine.encode(), 30000, own_record=mine).action is Action.RUN
    assert decide(False, in_progress_record("host:3"), 30000, own_record=mine).action is Action.BUSY
    with pytest.raises(ValueError, match="state 'weird'"):
        decide(False, '{"state": "weird"}', 10)


_results = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                        lambda children: (st.lists(children, max_size=3)
                                          | st.dictionaries(st.text(), children, max_size=3)),
                        max_leaves=8)


@given(holder=st.text(), token=st.text(min_size=1), result=_results)
def test_records_are_the_json_documents_they_always_were(holder, token, result):
    # Built without json.dumps's dict encoder (per task): the same text, byte for byte, so that every
    # reader — decide(), state(), a worker of another version during a rolling update — reads it as before.
    assert in_progress_record(holder, token) == json.dumps({"state": "in_progress", "holder": holder, "token": token})
    assert done_record(holder, result, token) == json.dumps({"state": "done", "holder": holder, "result": result,
                                                             "token": token})
    assert done_record(holder, result) == json.dumps({"state": "done", "holder": holder, "result": result})


@pytest.mark.parametrize("key", ["", None, 42, "x" * 513])
def test_a_bad_key_is_refused_naming_it(key):
    store = PostgresStore()
    with pytest.raises(InvalidKey, match="idempotency key"):
        with store.guard(key, conn=None):
            pass


def test_store_settings_are_validated():
    client = redis.Redis()  # not contacted
    with pytest.raises(ValueError, match=r"lease_seconds=0; valid: a number >= 0.1"):
        RedisStore(client=client, lease_seconds=0)
    with pytest.raises(ValueError, match=r"result_ttl_seconds=5; valid: a number >= 30.0"):
        RedisStore(client=client, lease_seconds=30, result_ttl_seconds=5)
    with pytest.raises(ValueError, match="table='bad name'"):
        PostgresStore(table="bad name")
    with pytest.raises(TypeError, match="needs connection="):
        idempotent(PostgresStore(), key=str)


# --- Redis store ----------------------------------------------------------------------------------

def test_unreachable_redis_runs_nothing_and_is_retryable():
    store = RedisStore(client=redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1))
    ran = []
    with pytest.raises(StoreUnavailable, match="idempotency key 'mail:5': the store is unreachable") as raised:
        with store.guard("mail:5"):
            ran.append(True)
    assert ran == []
    # The taskherd Task class retries both with backoff (they are TransientErrors).
    assert ErrorClassifier().is_transient(raised.value)
    assert ErrorClassifier().is_transient(InProgress("k", retry_after=1.0))


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def test_store_scripts_survive_an_empty_script_cache_and_a_dropped_connection(redis_url):
    from taskherd.worker.idempotency.scripts import Scripts

    name = f"scripts-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url, client_name=name)
    echo = Scripts(client).register(f"return '{name}:' .. ARGV[1]")  # new source: not in the cache
    assert echo(keys=[], args=["a"]) == f"{name}:a".encode()           # NOSCRIPT, then EVAL
    assert echo(keys=[], args=["b"]) == f"{name}:b".encode()           # EVALSHA
    admin = redis.Redis.from_url(redis_url)
    [ours] = [c for c in admin.client_list() if c["name"] == name]
    admin.client_kill_filter(_id=ours["id"])
    assert echo(keys=[], args=["c"]) == f"{name}:c".encode()           # reconnected and re-sent once
    admin.close()


def test_redis_duplicate_threads_run_the_effect_once(redis_client):
    store = RedisStore(client=redis_client, poll_interval_seconds=0.01)
    key = f"charge:{uuid.uuid4()}"
    barrier = threading.Barrier(16)
    results: list = []

    @idempotent(store, key=lambda order: f"charge:{order}", wait_seconds=20)
    def charge(order):
        redis_client.rpush(f"ledger:{order}", threading.get_ident())
        time.sleep(0.3)  # hold the key while the others arrive
        return {"charged_by": threading.get_ident()}

    def deliver():
        barrier.wait()
        results.append(charge(key.split(":", 1)[1]))

    threads = [threading.Thread(target=deliver) for _ in range(16)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert redis_client.llen(f"ledger:{key.split(':', 1)[1]}") == 1
    assert len(results) == 16 and all(r == results[0] for r in results), results


def test_redis_duplicate_processes_run_the_effect_once(redis_url, redis_client, deliverers):
    names = [f"p{i}" for i in range(6)]
    for name in names:
        deliverers.start("redis", redis_url, "order-7", name, hold=1.0)
    deliverers.wait_ready(names)
    deliverers.go()
    outcomes = [deliverers.outcome(name) for name in names]
    winners = [o for o in outcomes if o["ran"]]
    assert len(winners) == 1, outcomes
    assert redis_client.lrange("ledger:order-7", 0, -1) == [winners[0]["name"].encode()]
    # Without waiting, the others saw it in progress, with the lease left as their retry countdown.
    assert all(o.get("in_progress") and 0 < o["retry_after"] <= 30 for o in outcomes if not o["ran"]), outcomes
    # A later duplicate gets the stored result, without running the effect.
    with RedisStore(client=redis_client).guard("order-7") as claim:
        assert (claim.done, claim.result) == (True, winners[0]["name"])


def test_redis_failed_effect_releases_the_key_for_a_retry(redis_client):
    store = RedisStore(client=redis_client)
    with pytest.raises(ConnectionError):
        with store.guard("send-mail:1") as claim:
            assert not claim.done
            raise ConnectionError("smtp down")
    assert store.state("send-mail:1") is None
    with store.guard("send-mail:1") as claim:
        assert not claim.done
        claim.set_result("sent")
    assert store.state("send-mail:1")["state"] == "done"
    assert 0 < redis_client.ttl(store.prefix + "send-mail:1") <= 7 * 24 * 3600


def test_redis_lease_of_a_killed_holder_is_taken_over_after_the_lease(redis_url, redis_client, deliverers):
    holder = deliverers.start("redis", redis_url, "job-1", "holder", hold=120, lease=2)
    deliverers.wait_ready(["holder"])
    deliverers.go()
    assert '"effect"' in holder.stdout.readline()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    killed_at = time.monotonic()

    store = RedisStore(client=redis_client, lease_seconds=2, poll_interval_seconds=0.05)
    with pytest.raises(InProgress) as busy:
        with store.guard("job-1"):
            pytest.fail("ran while the dead holder's lease was still valid")
    assert "job-1" in str(busy.value) and busy.value.retry_after <= 2
    with store.guard("job-1", wait_seconds=10) as claim:
        taken_over_after = time.monotonic() - killed_at
        assert not claim.done
        redis_client.rpush("ledger:job-1", "taker")
    # Refused while the lease ran (above), taken over once it ran out: within the lease after the kill.
    assert taken_over_after < 2 + 1.5, taken_over_after
    assert redis_client.lrange("ledger:job-1", 0, -1) == [b"holder", b"taker"]


def test_redis_live_slow_holder_keeps_its_key_past_the_lease(redis_url, redis_client, deliverers):
    holder = deliverers.start("redis", redis_url, "job-2", "holder", hold=4, lease=1)
    deliverers.wait_ready(["holder"])
    deliverers.go()
    assert '"effect"' in holder.stdout.readline()

    store = RedisStore(client=redis_client, lease_seconds=1)
    refused_at: list[float] = []
    while holder.poll() is None:  # four leases long: renewal must keep it
        try:
            with store.guard("job-2") as claim:
                if not claim.done:
                    pytest.fail("took over the key of a live holder")
                break
        except InProgress:
            refused_at.append(time.monotonic())
        time.sleep(0.2)
    outcome = deliverers.outcome("holder")
    assert outcome["ran"], outcome
    # Refused for well over the 1 s lease: the holder's renewals kept it.
    assert refused_at and refused_at[-1] - refused_at[0] > 2.5, refused_at
    with store.guard("job-2") as claim:
        assert (claim.done, claim.result) == (True, "holder")
    assert redis_client.llen("ledger:job-2") == 1


# --- PostgreSQL store -----------------------------------------------------------------------------

def ledger(dsn: str, key: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT who FROM ledger WHERE key = %s", (key,))]


def test_a_redis_that_stops_answering_does_not_stall_another_stores_leases(redis_url, tmp_path):
    """Two stores in one process: store A's Redis freezes (SIGSTOP) while A holds a key. Store B's
    1.5 s lease, held for 5 s, must keep being renewed: A's hung renewal is another thread's, and
    it times out instead of blocking for ever (A's client was made without a socket timeout)."""
    from support.private_redis import private_redis

    with private_redis(tmp_path / "frozen") as (frozen_url, frozen):
        store_a = RedisStore(client=redis.Redis.from_url(frozen_url), lease_seconds=3)
        store_b = RedisStore(client=redis.Redis.from_url(redis_url), lease_seconds=1.5)
        key_a, key_b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
        with store_a.guard(key_a) as claim_a:
            assert not claim_a.done
            frozen.send_signal(signal.SIGSTOP)
            try:
                with store_b.guard(key_b) as claim_b:
                    states = []
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline:
                        states.append((store_b.state(key_b) or {}).get("state"))
                        time.sleep(0.1)
                    claim_b.set_result("b done")  # LeaseLost at the end of the block if B's key lapsed
            finally:
                frozen.send_signal(signal.SIGCONT)
    assert set(states) == {"in_progress"}, f"B's key lapsed while A's Redis was frozen: {states}"
    assert store_b.state(key_b)["state"] == "done"


def test_a_redis_effect_commits_with_the_done_record_or_not_at_all(redis_client):
    from taskherd.worker.idempotency import LeaseLost

    store = RedisStore(client=redis_client, lease_seconds=0.5)
    key, ledger = f"tx-{uuid.uuid4().hex}", f"ledger-{uuid.uuid4().hex}"
    with store.guard(key) as claim:
        claim.in_transaction(lambda pipe: pipe.rpush(ledger, "charged"))
        assert redis_client.llen(ledger) == 0, "queued, not applied, while the body runs"
        claim.set_result("ok")
    assert redis_client.lrange(ledger, 0, -1) == [b"charged"] and store.state(key)["state"] == "done"
    with store.guard(key) as again:
        assert again.done and again.result == "ok"

    # Paused past its lease, taken over by another holder: the first holder's effect is discarded.
    paused_store = RedisStore(client=redis_client, lease_seconds=0.5)
    paused_store._renewer = _NoRenewals()  # noqa: SLF001
    paused = f"tx-{uuid.uuid4().hex}"
    with pytest.raises(LeaseLost):
        with paused_store.guard(paused) as first:
            first.in_transaction(lambda pipe: pipe.rpush(ledger, "first"))
            time.sleep(0.7)
            with store.guard(paused) as second:
                second.in_transaction(lambda pipe: pipe.rpush(ledger, "second"))
    assert redis_client.lrange(ledger, 0, -1) == [b"charged", b"second"]


class _PoollessClient:
    """A client without a connection pool, as redis-py's cluster client is: every command passes
    through to a real Redis, only `connection_pool` is missing."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        if name == "connection_pool":
            raise AttributeError(name)
        return getattr(self._client, name)


def test_a_client_without_a_pool_is_refused_the_commit_at_once_and_the_key_released(redis_client):
    store = RedisStore(client=_PoollessClient(redis_client), lease_seconds=30)
    key, ledger = f"tx-{uuid.uuid4().hex}", f"ledger-{uuid.uuid4().hex}"
    with pytest.raises(TypeError, match=r"_PoollessClient has no connection pool.*in_transaction"):
        with store.guard(key) as claim:
            claim.in_transaction(lambda pipe: pipe.rpush(ledger, "charged"))
    assert redis_client.llen(ledger) == 0 and store.state(key) is None, "nothing applied, key free at once"
    with pytest.raises(TypeError, match=r"in_transaction\(queue_effects\): a function .* got a str"):
        with RedisStore(client=redis_client).guard(key) as claim:
            claim.in_transaction("RPUSH ledger charged")
    assert store.state(key) is None, "refused in the body: the key is free at once"
    with store.guard(key) as claim:  # the plain guard still works on such a client (redis-py's scripts)
        redis_client.rpush(ledger, "charged")
    assert redis_client.llen(ledger) == 1 and store.state(key)["state"] == "done"


class _NoRenewals:
    """A holder paused past its lease: its renewals never run."""

    def add(self, renew, every_seconds):
        return 0

    def remove(self, lease_id):
        return False


def _wrap_commit_packets(store, monkeypatch, change):
    """Replaces the store's one-packet sends by ``change(send, commands, attempt)``; returns the
    attempts' commands."""
    send, attempts = store._scripts.pipeline, []  # noqa: SLF001

    def changed(commands):
        attempts.append(commands)
        return change(send, commands, len(attempts))

    monkeypatch.setattr(store._scripts, "pipeline", changed)  # noqa: SLF001
    return attempts


def test_a_commit_whose_reply_was_lost_is_not_applied_again(redis_client, monkeypatch):
    """The commit is applied, then the connection drops before its reply: the retry finds the key
    done by its own record and applies nothing more."""
    store = RedisStore(client=redis_client)
    key, ledger = f"tx-{uuid.uuid4().hex}", f"ledger-{uuid.uuid4().hex}"

    def reply_lost_once(send, commands, attempt):
        replies = send(commands)
        if attempt == 1:
            raise redis.ConnectionError("connection dropped before the reply")
        return replies

    attempts = _wrap_commit_packets(store, monkeypatch, reply_lost_once)
    with store.guard(key) as claim:
        claim.in_transaction(lambda pipe: pipe.rpush(ledger, "charged"))
        claim.set_result("ok")
    assert len(attempts) == 2
    assert redis_client.lrange(ledger, 0, -1) == [b"charged"]
    assert store.state(key)["state"] == "done" and store.state(key)["result"] == "ok"


def test_a_commit_whose_key_changed_under_it_is_applied_on_the_next_try(redis_client, monkeypatch):
    """A write to the key between WATCH and EXEC (our own renewal in flight) aborts the EXEC; the
    commit looks again and applies the effect once."""
    store = RedisStore(client=redis_client)
    key, ledger = f"tx-{uuid.uuid4().hex}", f"ledger-{uuid.uuid4().hex}"

    def renewed_in_between_once(send, commands, attempt):
        if attempt > 1:
            return send(commands)
        watch, *rest = commands
        renewal = ("PEXPIRE", store.prefix + key, 30000)
        watch_reply, renewal_reply, *rest_replies = send([watch, renewal, *rest])
        assert renewal_reply == 1 and rest_replies[-1] is None, "the renewal should have aborted the EXEC"
        return [watch_reply, *rest_replies]

    attempts = _wrap_commit_packets(store, monkeypatch, renewed_in_between_once)
    with store.guard(key) as claim:
        claim.in_transaction(lambda pipe: pipe.rpush(ledger, "charged"))
    assert len(attempts) == 2
    assert redis_client.lrange(ledger, 0, -1) == [b"charged"] and store.state(key)["state"] == "done"


def test_an_effect_redis_refuses_is_not_applied_and_one_that_fails_as_it_runs_is(redis_client):
    """As redis-py's own transactions: a command Redis refuses when queued (wrong arguments) aborts
    the whole commit, its error raised and the key left to its lease; a command that fails as it
    runs (WRONGTYPE) raises too, the rest and the done record applied."""
    store = RedisStore(client=redis_client)
    ledger, text = f"ledger-{uuid.uuid4().hex}", f"text-{uuid.uuid4().hex}"
    refused = f"tx-{uuid.uuid4().hex}"
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        with store.guard(refused) as claim:
            claim.in_transaction(lambda pipe: pipe.rpush(ledger, "a").execute_command("RPUSH", ledger))
    assert redis_client.llen(ledger) == 0 and store.state(refused)["state"] == "in_progress"

    redis_client.set(text, "not a list")
    failed = f"tx-{uuid.uuid4().hex}"
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        with store.guard(failed) as claim:
            claim.in_transaction(lambda pipe: pipe.rpush(text, "x").rpush(ledger, "b"))
    assert redis_client.lrange(ledger, 0, -1) == [b"b"] and store.state(failed)["state"] == "done"


@pytest.mark.parametrize("options", [{}, {"decode_responses": True}, {"protocol": 3},
                                     {"protocol": 3, "decode_responses": True}],
                         ids=["resp2", "resp2-decoded", "resp3", "resp3-decoded"])
def test_a_commit_reads_every_reply_shape_redis_py_clients_get(redis_url, options):
    """The commit's replies (OK, QUEUED, the check's integer, EXEC's array) read in both protocols,
    with and without decode_responses; the duplicate gets the stored result back."""
    client = redis.Redis.from_url(redis_url, **options)
    store = RedisStore(client=client)
    key, ledger = f"tx-{uuid.uuid4().hex}", f"ledger-{uuid.uuid4().hex}"
    results = []
    for _ in range(2):
        with store.guard(key) as claim:
            if not claim.done:
                claim.in_transaction(lambda pipe: pipe.rpush(ledger, "x").hset(f"{ledger}:h", mapping={"a": 1}))
                claim.set_result({"n": 1})
            results.append((claim.done, claim.result))
    assert results == [(False, {"n": 1}), (True, {"n": 1})]
    raw = redis.Redis.from_url(redis_url)
    assert raw.lrange(ledger, 0, -1) == [b"x"] and raw.hgetall(f"{ledger}:h") == {b"a": b"1"}
    raw.close()
    client.close()


def test_holders_racing_past_their_leases_apply_exactly_the_effects_of_the_keys_they_completed(redis_client):
    """Eight holders of one key, none renewing, each pausing past the 50 ms lease at random before
    its commit: every holder that took the key over makes the earlier ones' commits fail. The
    ledger holds exactly one effect, the one of the holder whose record is done; every other
    holder got LeaseLost (or found the key busy) and applied nothing."""
    from taskherd.worker.idempotency import LeaseLost

    store = RedisStore(client=redis_client, lease_seconds=0.1)
    store._renewer = _NoRenewals()  # noqa: SLF001
    key, ledger = f"race-{uuid.uuid4().hex}", f"ledger-{uuid.uuid4().hex}"
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(8)

    def holder(name: str, pause: float) -> None:
        barrier.wait()
        try:
            with store.guard(key, wait_seconds=2) as claim:
                if claim.done:
                    outcomes[name] = "found done"
                    return
                time.sleep(pause)
                claim.in_transaction(lambda pipe: pipe.rpush(ledger, name))
                claim.set_result(name)
            outcomes[name] = "committed"
        except LeaseLost:
            outcomes[name] = "lease lost"

    pauses = [0.0, 0.15, 0.02, 0.3, 0.12, 0.0, 0.25, 0.05]
    threads = [threading.Thread(target=holder, args=(f"h{i}", pause)) for i, pause in enumerate(pauses)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    committed = sorted(name for name, outcome in outcomes.items() if outcome == "committed")
    assert len(outcomes) == 8, outcomes
    assert [entry.decode() for entry in redis_client.lrange(ledger, 0, -1)] == committed, outcomes
    assert store.state(key)["state"] == "done" and store.state(key)["result"] in committed, outcomes


def test_postgres_duplicate_threads_run_the_effect_once(ledger_dsn):
    store = PostgresStore()
    barrier = threading.Barrier(12)
    results: list = []

    def deliver(name):
        with psycopg.connect(ledger_dsn, autocommit=True) as conn:
            barrier.wait()
            with store.guard("refund:9", conn=conn) as claim:
                if claim.done:
                    results.append(claim.result)
                    return
                conn.execute("INSERT INTO ledger (key, who) VALUES ('refund:9', %s)", (name,))
                time.sleep(0.3)
                claim.set_result({"refunded_by": name})
                results.append(claim.result)

    threads = [threading.Thread(target=deliver, args=(f"t{i}",)) for i in range(12)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert len(ledger(ledger_dsn, "refund:9")) == 1
    assert len(results) == 12 and all(r == results[0] for r in results), results


def test_postgres_duplicate_processes_run_the_effect_once(ledger_dsn, deliverers):
    names = [f"p{i}" for i in range(6)]
    for name in names:
        deliverers.start("postgres", ledger_dsn, "ship:3", name, hold=1.0)
    deliverers.wait_ready(names)
    deliverers.go()
    outcomes = [deliverers.outcome(name) for name in names]
    winners = [o["name"] for o in outcomes if o["ran"]]
    assert len(winners) == 1, outcomes
    # The losers waited for the winner's transaction and then got its result.
    assert all(o["result"] == winners[0] for o in outcomes), outcomes
    assert ledger(ledger_dsn, "ship:3") == winners


def test_postgres_key_and_effect_commit_or_roll_back_together(ledger_dsn):
    store = PostgresStore()
    with psycopg.connect(ledger_dsn) as conn:
        with pytest.raises(ZeroDivisionError):
            with store.guard("invoice:1", conn=conn):
                conn.execute("INSERT INTO ledger (key, who) VALUES ('invoice:1', 'first')")
                1 / 0
        assert not store.is_done(conn, "invoice:1") and ledger(ledger_dsn, "invoice:1") == []

        # Inside the caller's own transaction: the caller's rollback undoes the key too.
        with conn.transaction() as outer:
            with store.guard("invoice:1", conn=conn):
                conn.execute("INSERT INTO ledger (key, who) VALUES ('invoice:1', 'second')")
            assert ledger(ledger_dsn, "invoice:1") == []  # not committed yet: invisible elsewhere
            raise psycopg.Rollback(outer)
        assert not store.is_done(conn, "invoice:1")

        with store.guard("invoice:1", conn=conn) as claim:
            assert not claim.done
            conn.execute("INSERT INTO ledger (key, who) VALUES ('invoice:1', 'third')")
            claim.set_result(3)
        with store.guard("invoice:1", conn=conn) as claim:
            assert (claim.done, claim.result) == (True, 3)
    assert ledger(ledger_dsn, "invoice:1") == ["third"]


def test_postgres_guard_inside_the_callers_transaction_keeps_it_usable(ledger_dsn):
    """Behind its own savepoint: a failed guarded effect (even a failed statement) is undone alone,
    the caller's earlier work and its transaction stay; nested guards each have their own."""
    store = PostgresStore()
    with psycopg.connect(ledger_dsn) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO ledger (key, who) VALUES ('order:9', 'caller')")
            with pytest.raises(psycopg.errors.UndefinedTable):
                with store.guard("invoice:9", conn=conn):
                    conn.execute("INSERT INTO no_such_table VALUES (1)")
            with pytest.raises(ValueError):
                with store.guard("invoice:9", conn=conn):
                    conn.execute("INSERT INTO ledger (key, who) VALUES ('invoice:9', 'undone')")
                    raise ValueError("the effect fails")
            with store.guard("invoice:9", conn=conn) as claim:
                with store.guard("receipt:9", conn=conn) as inner:
                    conn.execute("INSERT INTO ledger (key, who) VALUES ('receipt:9', 'inner')")
                    inner.set_result("r")
                conn.execute("INSERT INTO ledger (key, who) VALUES ('invoice:9', 'kept')")
                claim.set_result({"n": 9})
            with store.guard("invoice:9", conn=conn) as again:
                assert (again.done, again.result) == (True, {"n": 9})
    assert ledger(ledger_dsn, "order:9") == ["caller"]
    assert ledger(ledger_dsn, "invoice:9") == ["kept"] and ledger(ledger_dsn, "receipt:9") == ["inner"]


# --- arguments refused where they are written ------------------------------------------------------

def _redis_store(**settings):
    return RedisStore(**{"client": redis.Redis(), **settings})  # not contacted


def _guard_redis(**options):
    with _redis_store().guard("k", **options):
        pass


def _guard_postgres(key="k", conn=None):
    with PostgresStore().guard(key, conn=conn):
        pass


_NOT_A_DURATION = [math.nan, math.inf, -math.inf, True, "30", None]


@pytest.mark.parametrize(("make", "error", "message"), [
    *[(lambda v=v: _redis_store(lease_seconds=v), (TypeError, ValueError),
       rf"RedisStore lease_seconds={re.escape(repr(v))}.*valid: a number >= 0.1 and <= 1e\+15")
      for v in _NOT_A_DURATION],
    *[(lambda v=v: _redis_store(result_ttl_seconds=v), (TypeError, ValueError),
       rf"RedisStore result_ttl_seconds={re.escape(repr(v))}.*valid: a number >= 30.0 and <= 1e\+15")
      for v in [*_NOT_A_DURATION, 10 ** 20, 10 ** 400]],
    *[(lambda v=v: _redis_store(poll_interval_seconds=v), (TypeError, ValueError),
       rf"RedisStore poll_interval_seconds={re.escape(repr(v))}.*valid: a number >= 0.001")
      for v in [*_NOT_A_DURATION, 0]],
    (lambda: RedisStore(client=None), TypeError, r"RedisStore client= got a NoneType; valid: a synchronous redis-py"),
    (lambda: RedisStore(client="redis://:secret@host"), TypeError, r"client= got a str; valid: .*redis.Redis"),
    (lambda: RedisStore(client=redis.asyncio.Redis()), TypeError,
     r"client= got an asyncio client \(redis\.asyncio\.client\.Redis\); .*needs a synchronous one; "
     r"valid: a synchronous redis-py client: redis\.Redis"),
    (lambda: _redis_store(prefix=None), TypeError, r"RedisStore prefix=None \(NoneType\); valid: a str"),
    (lambda: _redis_store(prefix=b"app:"), TypeError, r"RedisStore prefix=b'app:' \(bytes\); valid: a str"),
    *[(lambda v=v: _guard_redis(wait_seconds=v), (TypeError, ValueError),
       rf"RedisStore.guard wait_seconds={re.escape(repr(v))}.*valid: a number >= 0 \(finite\)")
      for v in [-1, "x", None, math.nan, math.inf]],
    (lambda: PostgresStore(table=None), TypeError, r"PostgresStore table=None; valid: an unquoted identifier"),
    (lambda: PostgresStore(table="ledger\n"), ValueError, r"PostgresStore table='ledger\\n'; valid: an unquoted"),
    (lambda: _guard_postgres(conn=None), TypeError, r"PostgresStore.guard conn= got a NoneType; valid: a psycopg"),
    (lambda: _guard_postgres(conn="postgresql://u:secret@h/db"), TypeError, r"^PostgresStore.guard conn= got a str"),
    (lambda: _guard_postgres(key="a\x00b"), InvalidKey, r"idempotency key 'a\\x00b' contains NUL"),
    (lambda: PostgresStore().purge(None, older_than_seconds=1), TypeError, r"PostgresStore.purge conn= got a None"),
    (lambda: PostgresStore().is_done(None, "k"), TypeError, r"PostgresStore.is_done conn= got a NoneType"),
    (lambda: PostgresStore().create_table(None), TypeError, r"PostgresStore.create_table conn= got a NoneType"),
    *[(lambda v=v: idempotent(_redis_store(), key=str, wait_seconds=v), (TypeError, ValueError),
       rf"idempotent wait_seconds={re.escape(repr(v))}.*valid: a number >= 0 \(finite\)")
      for v in [-1, "x", None, math.nan, math.inf, True]],
    *[(lambda v=v: idempotent(_redis_store(), key=v), TypeError,
       rf"idempotent key={re.escape(repr(v))}; valid: a function of the task's arguments returning the key")
      for v in ["static", None, 42]],
    (lambda: idempotent(None, key=str), TypeError, r"idempotent store= got a NoneType; valid: a RedisStore or"),
    (lambda: idempotent(PostgresStore(), key=str, connection="conn"), TypeError,
     r"idempotent connection= got a str; valid: a function of the task's arguments"),
    (lambda: idempotent(PostgresStore(), key=str, connection=lambda: None, wait_seconds=5), TypeError,
     r"idempotent\(PostgresStore\) takes no wait_seconds="),
    (lambda: idempotent(_redis_store(), key=str)("charge"), TypeError, r"decorates a function, got 'charge'"),
])
def test_bad_arguments_are_refused_at_once_naming_them_and_the_valid_range(make, error, message):
    """Refused where the user writes them (construction, decoration, the `with`), not inside a task
    where they would be dead-lettered as a permanent error that names no argument; never a URL's or
    a DSN's password in the message."""
    with pytest.raises(error, match=message) as raised:
        make()
    assert "secret" not in str(raised.value)


def test_a_bad_key_function_or_wait_is_refused_at_decoration_not_in_the_call():
    """`key=` and `wait_seconds=` fail at decoration: the function never runs with them."""
    calls = []

    def charge(order_id):
        calls.append(order_id)

    with pytest.raises(TypeError, match="idempotent key='static'"):
        idempotent(_redis_store(), key="static")(charge)
    with pytest.raises(ValueError, match="idempotent wait_seconds=-1"):
        idempotent(_redis_store(), key=str, wait_seconds=-1)(charge)
    assert calls == []


def test_valid_edge_values_and_clients_without_a_pool_are_accepted(redis_client):
    store = RedisStore(client=_PoollessClient(redis_client), prefix="", lease_seconds=0.1, result_ttl_seconds=1e15,
                       poll_interval_seconds=0.001)
    assert (store.lease_seconds, store.result_ttl_seconds) == (0.1, 1e15)
    key = f"edge-{uuid.uuid4().hex}"
    with store.guard(key, wait_seconds=0) as claim:
        claim.set_result(1)
    with store.guard(key, wait_seconds=2.5) as claim:
        assert (claim.done, claim.result) == (True, 1)
    assert idempotent(store, key=str, wait_seconds=1)(str.upper)(key) == 1  # done: the stored result
    redis_client.delete(key)


# --- results as Celery's JSON serializer carries them ---------------------------------------------

#: what `.delay()` and a JSON result backend carry beyond plain JSON (kombu.utils.json)
_CELERY_RESULT = {"at": datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc), "day": date(2026, 1, 2),
                  "amount": Decimal("10.10"), "id": uuid.UUID(int=7), "raw": b"\xff\x00", "text": b"ok",
                  "plain": [1, 2.5, None, "x"]}


class _Unencodable:
    pass


def _effect_count(redis_client, name: str) -> int:
    return redis_client.llen(name)


@pytest.mark.parametrize("store_kind", ["redis", "redis-transaction", "postgres"])
def test_a_result_celerys_json_carries_is_returned_to_duplicates_as_celery_would(store_kind, redis_client, ledger_dsn):
    """A datetime, Decimal, UUID or bytes result: the effect runs once, the task succeeds, and a
    duplicate returns what Celery's JSON would have handed over (not a failure, not a rollback)."""
    key = f"dtret:{uuid.uuid4().hex}"
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        if store_kind == "postgres":
            @idempotent(PostgresStore(), key=lambda task, k, conn: f"dtret:{k}", connection=lambda task, k, conn: conn)
            def dt_ret(task, k, conn):
                conn.execute("INSERT INTO ledger (key, who) VALUES (%s, 'run')", (f"dtret:{k}",))
                return dict(_CELERY_RESULT)
        else:
            store = RedisStore(client=redis_client)

            @idempotent(store, key=lambda task, k, conn: f"dtret:{k}")
            def dt_ret(task, k, conn):
                if store_kind == "redis":
                    redis_client.rpush(f"ledger:{key}", "run")
                else:
                    with store.guard(f"inner:{k}") as claim:
                        claim.in_transaction(lambda pipe: pipe.rpush(f"ledger:{key}", "run"))
                        claim.set_result(dict(_CELERY_RESULT))
                return dict(_CELERY_RESULT)

        k = key.split(":", 1)[1]
        first, again = dt_ret(None, k, conn), dt_ret(None, k, conn)
    celery_would_return = kombu_json.loads(kombu_json.dumps(_CELERY_RESULT))
    assert first == _CELERY_RESULT and again == celery_would_return == _CELERY_RESULT
    assert type(again["at"]) is datetime and type(again["amount"]) is Decimal and type(again["raw"]) is bytes
    effects = ledger(ledger_dsn, key) if store_kind == "postgres" else redis_client.lrange(f"ledger:{key}", 0, -1)
    assert len(effects) == 1


def test_a_postgres_result_celerys_json_cannot_encode_fails_before_the_commit_naming_key_store_and_type(ledger_dsn):
    store = PostgresStore()
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        for key, result, why in [("unenc:1", {"x": _Unencodable()}, "Object of type _Unencodable"),
                                 ("unenc:2", float("nan"), "NaN and infinite floats cannot be stored in PostgreSQL jsonb"),
                                 ("unenc:3", ["a\x00b"], "NUL")]:
            with pytest.raises(TypeError) as raised:
                with store.guard(key, conn=conn) as claim:
                    conn.execute("INSERT INTO ledger (key, who) VALUES (%s, 'run')", (key,))
                    claim.set_result(result)
            message = str(raised.value)
            assert f"idempotency key {key!r} (PostgresStore): the result, a {type(result).__name__}, cannot be " \
                   f"stored" in message and why in message and "nothing was committed" in message, message
            assert not store.is_done(conn, key) and ledger(ledger_dsn, key) == []
        # Inside the caller's transaction: back to the guard's savepoint, the caller's work goes on.
        with conn.transaction():
            conn.execute("INSERT INTO ledger (key, who) VALUES ('unenc:caller', 'caller')")
            with pytest.raises(TypeError, match=r"'unenc:4' \(PostgresStore\).*guard's savepoint"):
                with store.guard("unenc:4", conn=conn) as claim:
                    conn.execute("INSERT INTO ledger (key, who) VALUES ('unenc:4', 'run')")
                    claim.set_result(_Unencodable())
        assert ledger(ledger_dsn, "unenc:caller") == ["caller"] and ledger(ledger_dsn, "unenc:4") == []


def test_a_redis_result_celerys_json_cannot_encode_names_key_store_and_type_and_never_repeats_the_effect(redis_client):
    store = RedisStore(client=redis_client)
    # A commit with the done record: nothing applied, the key free for a corrected retry.
    key = f"unenc:{uuid.uuid4().hex}"
    with pytest.raises(TypeError, match=rf"idempotency key '{key}' \(RedisStore\): the result, a _Unencodable, "
                                        r"cannot be stored \(Object of type _Unencodable.*nothing was applied"):
        with store.guard(key) as claim:
            claim.in_transaction(lambda pipe: pipe.rpush(f"ledger:{key}", "run"))
            claim.set_result(_Unencodable())
    assert redis_client.llen(f"ledger:{key}") == 0 and store.state(key) is None
    # An effect outside Redis has happened: the key is done (result None), so it never runs again.
    calls = []

    @idempotent(store, key=lambda k: k)
    def effect(k):
        calls.append(k)
        return {"when": _Unencodable()}

    key = f"unenc:{uuid.uuid4().hex}"
    with pytest.raises(TypeError, match=rf"'{key}' \(RedisStore\): the result, a dict.*the effect ran once and the "
                                        r"key is recorded as done with result None"):
        effect(key)
    assert effect(key) is None and calls == [key]


@pytest.mark.parametrize(("fn_source", "key", "expected"), [
    ("def mismatch(task, order_id): pass", lambda order_id: f"mis:{order_id}",
     r"idempotent key=<lambda>\(order_id\) cannot take the arguments of the task .*mismatch\(task, order_id\), "
     r"which the decorator calls it with — key\(task, order_id\): too many positional arguments; valid: a function "
     r"of the same parameters, e\.g\. key=lambda task, order_id: …"),
    ("def by_name(task, order_id): pass", lambda task, oid: oid,
     r"key\(task, order_id=…\): missing a required argument: 'oid'"),
    ("def options(task, order_id, **opts): pass", lambda task, order_id: order_id,
     r"key\(task, order_id, \*\*opts\): got an unexpected keyword argument \(any keyword the task's \*\*opts"),
    ("def extra(task, *orders): pass", lambda task: "k", r"key\(task, \*orders\): too many positional arguments"),
    ("def kw(task, *, conn): pass", lambda task: "k", r"key\(task, conn=…\): got an unexpected keyword argument"),
])
def test_a_key_function_that_cannot_take_the_tasks_arguments_is_refused_at_decoration(fn_source, key, expected):
    namespace: dict = {}
    exec(fn_source, namespace)
    fn = next(v for k, v in namespace.items() if k != "__builtins__")
    with pytest.raises(TypeError, match=expected):
        idempotent(_redis_store(), key=key)(fn)
    as_connection = expected.replace("key=", "connection=").replace("key\\(", "connection\\(")
    with pytest.raises(TypeError, match=as_connection):
        idempotent(PostgresStore(), key=lambda *a, **kw: "k", connection=key)(fn)


def test_key_functions_that_take_the_tasks_arguments_are_accepted():
    def charge(task, order_id, *, attempt=1, conn=None):
        return order_id

    for key in [lambda task, order_id, **_: "k", lambda task, *a, **kw: "k", lambda *a, **kw: "k",
                lambda task, order_id, attempt=0, conn=None: "k"]:
        idempotent(_redis_store(), key=key)(charge)
    idempotent(_redis_store(), key=str)(str.upper)  # no signature to read: nothing to compare


def test_postgres_guard_refuses_an_implicit_transaction_nobody_would_commit(ledger_dsn):
    """autocommit off and a statement before the guard: nested in that implicit transaction, the
    guard would succeed and leave key and effect uncommitted. Refused before anything is written;
    the documented forms (an idle connection, a `conn.transaction()` block, autocommit) still work."""
    store = PostgresStore()
    with psycopg.connect(ledger_dsn) as conn:
        conn.execute("SELECT 1")
        ran = []
        with pytest.raises(RuntimeError, match=r"PostgresStore.guard\('implicit:1', conn=…\): the connection has a "
                                               r"transaction open that nothing here commits .*valid: an idle connection"):
            with store.guard("implicit:1", conn=conn):
                ran.append(True)
        assert ran == [] and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.rollback()
        # Wrapped in conn.transaction() the caller says who commits: the guard nests in it.
        conn.execute("SELECT 1")
        with conn.transaction():
            with store.guard("implicit:2", conn=conn):
                conn.execute("INSERT INTO ledger (key, who) VALUES ('implicit:2', 'run')")
        conn.commit()
        # Idle: the guard's own transaction commits.
        with store.guard("implicit:3", conn=conn):
            conn.execute("INSERT INTO ledger (key, who) VALUES ('implicit:3', 'run')")
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with psycopg.connect(ledger_dsn, autocommit=True) as conn:
        conn.execute("BEGIN")  # the caller's own explicit transaction, its own COMMIT
        with store.guard("implicit:4", conn=conn):
            conn.execute("INSERT INTO ledger (key, who) VALUES ('implicit:4', 'run')")
        conn.execute("COMMIT")
    assert [ledger(ledger_dsn, f"implicit:{n}") for n in (1, 2, 3, 4)] == [[], ["run"], ["run"], ["run"]]
