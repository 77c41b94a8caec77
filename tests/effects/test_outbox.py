"""Transactional outbox: rows committed with the caller's transaction, relayed by real `taskherd
outbox relay` processes (killed between publish and mark; two of them at once), consumed by a real
worker whose effect is guarded by the PostgreSQL idempotency store keyed on the task id (= row id).
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import psycopg
import pytest

from e2e.lib.waiting import wait_for
from support.worker_process import TESTS_DIR, python_env
from taskherd.worker import outbox

from .test_worker_sigkill import rows


class Relay:
    def __init__(self, log_dir: Path, name: str, args: list[str], env: dict[str, str]):
        self.log_path = log_dir / f"relay-{name}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "taskherd.cli", "outbox", "relay", *args], env=python_env(env),
                cwd=TESTS_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout: float = 60) -> None:
        wait_for(f"the relay to log {needle!r} (or to exit)", lambda: needle in self.log() or self.process.poll() is not None,
                 timeout=timeout)
        assert needle in self.log(), self.log()

    def stop(self, sig=signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


@pytest.fixture
def relays(tmp_path):
    started: list[Relay] = []

    def start(name: str, args: list[str], env: dict[str, str]) -> Relay:
        started.append(Relay(tmp_path, name, args, env))
        return started[-1]

    yield start
    for relay in started:
        if relay.process.poll() is None:
            relay.process.kill()
            relay.process.wait()


def app_env(broker_url: str, queue: str, dsn: str) -> dict[str, str]:
    return {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": queue, "TEST_PG_DSN": dsn}


def relay_args(dsn: str, *extra: str) -> list[str]:
    return ["--dsn", dsn, "--app", "apps.effects_app:app", *extra]


def enqueue_orders(dsn: str, orders, queue: str, *, commit: bool = True) -> list[str]:
    with psycopg.connect(dsn) as conn:
        ids = [outbox.enqueue(conn, "effects.record", args=[order], queue=queue) for order in orders]
        conn.commit() if commit else conn.rollback()
    return ids


def wait_for_queue_depth(api_url: str, amqp_url: str, queue: str, expected: int) -> None:
    """Waits for the management API to report `expected` messages (its counters lag a few seconds)."""
    vhost = unquote(urlsplit(amqp_url).path[1:])
    api = urlsplit(api_url)
    seen: list = []
    with httpx.Client(base_url=f"{api.scheme}://{api.hostname}:{api.port}", auth=(api.username, api.password)) as c:
        def depth_is_expected():
            seen.append(c.get(f"/api/queues/{vhost}/{queue}").json().get("messages"))
            return seen[-1] == expected
        try:
            wait_for(f"{expected} messages in {queue}", depth_is_expected, timeout=30, interval=0.5)
        except AssertionError:
            raise AssertionError(f"queue {queue} holds {seen[-1]} messages, expected {expected}") from None


def test_enqueue_belongs_to_the_callers_transaction(outbox_dsn):
    kept = enqueue_orders(outbox_dsn, [1, 2], "q")
    enqueue_orders(outbox_dsn, [3], "q", commit=False)
    assert [str(r[0]) for r in rows(outbox_dsn, "SELECT id FROM taskherd_outbox ORDER BY created_at")] == kept
    with pytest.raises(ValueError, match="batch_size=0; valid: an integer in 1..10000"):
        outbox.Relay(connect=lambda: None, publish=lambda rows: None, batch_size=0)


def test_enqueue_stores_arguments_as_celery_encodes_them_and_the_relay_hands_them_back(outbox_dsn):
    """`.delay(datetime)` works, so does the outbox: the task gets what the producer passed."""
    args = [datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc), Decimal("9.99"), uuid.UUID(int=5), b"\xff", "x"]
    kwargs = {"due": date(2026, 2, 3), "n": 1}
    with psycopg.connect(outbox_dsn) as conn:
        task_id = outbox.enqueue(conn, "effects.record", args=args, kwargs=kwargs, queue="q")
        outbox.enqueue(conn, "effects.record", args=(1,))  # a tuple is a list of arguments too
    published: list = []
    outbox.Relay(connect=lambda: psycopg.connect(outbox_dsn), publish=published.extend).run(once=True)
    assert [(row.id, row.args, row.kwargs) for row in published] == [(task_id, args, kwargs), (published[1].id, [1], {})]
    assert type(published[0].args[0]) is datetime and type(published[0].kwargs["due"]) is date


@pytest.mark.parametrize(("arguments", "message"), [
    ({"args": "ab"}, r"outbox args= got a str; valid: a list or tuple of the task's positional arguments"),
    ({"args": 5}, r"outbox args= got a int; valid: a list or tuple"),
    ({"kwargs": ["x"]}, r"outbox kwargs= got a list; valid: a mapping of the task's keyword arguments with str keys"),
    ({"kwargs": {1: "x"}}, r"outbox kwargs= has keys \[1\] that are not str; valid: a mapping with str keys"),
    ({"args": [object()]}, r"outbox args= cannot be stored \(Object of type object is not JSON serializable\); "
                           r"valid: a value Celery's JSON serializer encodes"),
    ({"kwargs": {"x": float("inf")}}, r"outbox kwargs= cannot be stored \(NaN and infinite floats cannot be stored in "
                                      r"PostgreSQL jsonb\)"),
    ({"args": ["a\x00"]}, r"outbox args= cannot be stored \(the character NUL"),
    ({"args": [{"__type__": "mine", "__value__": 1}]}, r"outbox args= cannot be stored \(a dict with exactly the keys "
                                                      r"'__type__' and '__value__'"),
    ({"queue": 5}, r"outbox queue=5; valid: a queue name \(a non-empty str, not starting with 'amq.'\), or None"),
    ({"queue": ""}, r"outbox queue=''; valid: a queue name"),
    ({"queue": "amq.orders"}, r"outbox queue='amq.orders' has the prefix 'amq.', which RabbitMQ reserves"),
    ({"queue": "orders\udc80"}, r"outbox queue='orders\\udc80' cannot be encoded in UTF-8 \(surrogates not allowed"),
])
def test_enqueue_refuses_arguments_celery_cannot_carry_naming_them_and_keeps_the_transaction(outbox_dsn, arguments,
                                                                                           message):
    with psycopg.connect(outbox_dsn) as conn:
        conn.execute("INSERT INTO ledger (key, who) VALUES ('outbox-caller', 'caller')")
        with pytest.raises((TypeError, ValueError), match=message):
            outbox.enqueue(conn, "effects.record", **arguments)
        conn.commit()  # refused before any statement: the caller's transaction is still usable
    assert rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox") == [(0,)]
    assert rows(outbox_dsn, "SELECT who FROM ledger WHERE key = 'outbox-caller'") == [("caller",)]


def outbox_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "taskherd.cli", "outbox", *args], env=python_env(env),
                          cwd=TESTS_DIR, capture_output=True, text=True, timeout=60)


def test_a_row_no_relay_can_publish_is_set_aside_with_its_reason_and_the_rows_behind_it_are_relayed(outbox_dsn):
    # Rows written by hand or by another program, not by enqueue(): each used to fail its whole batch
    # on every poll, and, being the oldest, stopped every row behind it for good.
    bad = {  # args text, kwargs text, task_name → the reason the relay gives
        "object args": ('{"order": 1}', "{}", "effects.record", r"args= got a dict; valid: a list or tuple"),
        "list kwargs": ("[1]", "[1]", "effects.record", r"kwargs= got a list; valid: a mapping"),
        "bad datetime": ('[{"__type__": "datetime", "__value__": "nope"}]', "{}", "effects.record",
                         r"args=.* cannot be read by Celery's JSON serializer \(ValueError"),
        "bad decimal": ('[{"__type__": "decimal", "__value__": "x"}]', "{}", "effects.record",
                        r"args=.* cannot be read by Celery's JSON serializer \(InvalidOperation"),
        "no task name": ("[1]", "{}", "", r"task_name=''; valid: a registered task name"),
    }
    first = enqueue_orders(outbox_dsn, [1], "q")
    with psycopg.connect(outbox_dsn) as conn:
        bad_ids = {what: str(conn.execute(
            "INSERT INTO taskherd_outbox (id, task_name, args, kwargs, queue) VALUES (gen_random_uuid(), %s, %s, %s, 'q') "
            "RETURNING id", (name, args, kwargs)).fetchone()[0]) for what, (args, kwargs, name, _) in bad.items()}
    last = enqueue_orders(outbox_dsn, [2], "q")

    published: list = []
    relay = outbox.Relay(connect=lambda: psycopg.connect(outbox_dsn), publish=published.extend, batch_size=2)
    assert relay.run(once=True) == 2
    assert [row.id for row in published] == first + last
    refused = {str(row_id): why for row_id, why in
               rows(outbox_dsn, "SELECT id, refused FROM taskherd_outbox WHERE sent_at IS NULL")}
    assert set(refused) == set(bad_ids.values())  # kept, not lost: set aside with the reason
    for what, (*_, reason) in bad.items():
        assert re.search(reason, refused[bad_ids[what]]), (what, refused[bad_ids[what]])

    status = outbox_cli("status", "--dsn", outbox_dsn)
    assert status.returncode == 0 and status.stdout.startswith("pending 0 ") and " refused 5" in status.stdout, status
    assert f"refused {bad_ids['object args']}: args= got a dict" in status.stdout, status.stdout

    # Mended by hand and released: relayed like any other row.
    with psycopg.connect(outbox_dsn) as conn:
        conn.execute("UPDATE taskherd_outbox SET args = '[3]', refused = NULL WHERE id = %s", (bad_ids["object args"],))
    published.clear()
    assert relay.run(once=True) == 1 and [(row.id, row.args) for row in published] == [(bad_ids["object args"], [3])]


def test_a_relay_adds_the_refused_column_to_a_table_taskherd_0_1_created(outbox_dsn):
    with psycopg.connect(outbox_dsn) as conn:
        conn.execute("ALTER TABLE taskherd_outbox DROP COLUMN refused")  # the table as 0.1 created it
    ids = enqueue_orders(outbox_dsn, [1], "q")
    status = outbox_cli("status", "--dsn", outbox_dsn)
    assert status.returncode == 0 and status.stdout.startswith("pending 1 ") and " refused 0" in status.stdout, status
    published: list = []
    assert outbox.Relay(connect=lambda: psycopg.connect(outbox_dsn), publish=published.extend).run(once=True) == 1
    assert [row.id for row in published] == ids
    assert rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox WHERE refused IS NULL AND sent_at IS NOT NULL") == [(1,)]


@pytest.mark.slow
def test_relay_killed_between_publish_and_mark_loses_nothing_and_repeats_no_effect(
        amqp_url, rabbitmq_api_url, outbox_dsn, unique_name, relays, worker_factory):
    env = app_env(amqp_url, unique_name, outbox_dsn)
    ids = enqueue_orders(outbox_dsn, range(10), unique_name)

    crashing = relays("crashing", relay_args(outbox_dsn, "--batch-size", "10", "--once"),
                      {**env, "TASKHERD_OUTBOX_TEST_PAUSE_AFTER_PUBLISH": "1"})
    crashing.wait_for_log("pausing before marking them sent")
    crashing.stop(signal.SIGKILL)
    # Published (with confirms) but not marked: the broker has the messages, the rows are pending.
    wait_for_queue_depth(rabbitmq_api_url, amqp_url, unique_name, 10)
    assert rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox WHERE sent_at IS NULL") == [(10,)]

    again = relays("again", relay_args(outbox_dsn, "--once"), env)
    assert again.process.wait(timeout=60) == 0, again.log()
    assert "relayed 10 rows" in again.log()
    assert rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox WHERE sent_at IS NULL") == [(0,)]
    wait_for_queue_depth(rabbitmq_api_url, amqp_url, unique_name, 20)  # every row, twice

    worker_factory("apps.effects_app", queues=[unique_name], env=env, concurrency=2)
    wait_for("20 deliveries", lambda: rows(outbox_dsn, "SELECT count(*) FROM attempts"), timeout=60, equals=[(20,)])
    time.sleep(1)
    ledger = rows(outbox_dsn, "SELECT key FROM ledger ORDER BY key")
    assert sorted(f"task:{i}" for i in ids) == [k for (k,) in ledger]


@pytest.mark.slow
def test_two_relays_over_1000_rows_lose_none_and_apply_each_once(
        broker_url, outbox_dsn, unique_name, relays, worker_factory):
    env = app_env(broker_url, unique_name, outbox_dsn)
    worker_factory("apps.effects_app", queues=[unique_name], env=env, concurrency=2)
    pair = [relays(name, relay_args(outbox_dsn, "--batch-size", "20", "--poll-interval", "0.05"), env)
            for name in ("a", "b")]
    # Both relays are polling (connected to the database) before the rows arrive.
    wait_for("two relays", lambda: rows(outbox_dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND application_name = 'taskherd-outbox-relay'"), timeout=60, equals=[(2,)])

    ids: list[str] = []
    for batch in range(20):  # 20 transactions of 50 rows, while both relays run
        ids += enqueue_orders(outbox_dsn, range(batch * 50, batch * 50 + 50), unique_name)
        time.sleep(0.05)
    rolled_back = enqueue_orders(outbox_dsn, range(5000, 5050), unique_name, commit=False)
    assert len(ids) == 1000

    wait_for("all rows relayed", lambda: rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox WHERE sent_at IS NULL"),
             timeout=120, equals=[(0,)])
    wait_for("1000 tasks run", lambda: rows(outbox_dsn, "SELECT count(DISTINCT task_id) FROM attempts"),
             timeout=180, interval=0.5, equals=[(1000,)])
    for relay in pair:
        assert relay.stop() == 0, relay.log()
    relayed_by = dict(rows(outbox_dsn, "SELECT relayed_by, count(*) FROM taskherd_outbox GROUP BY relayed_by"))
    assert len(relayed_by) == 2 and sum(relayed_by.values()) == 1000, relayed_by  # SKIP LOCKED shared the work
    ledger = [k for (k,) in rows(outbox_dsn, "SELECT key FROM ledger")]
    assert sorted(ledger) == sorted(f"task:{i}" for i in ids)  # no row lost, none applied twice
    assert not set(ledger) & {f"task:{i}" for i in rolled_back}


def test_cli_migrates_reports_pending_and_refuses_bad_options(pg_dsn):
    for _ in range(2):  # twice: migrating an existing table is a no-op
        done = outbox_cli("migrate", "--dsn", pg_dsn)
        assert done.returncode == 0 and "taskherd_outbox is ready" in done.stdout, done.stderr
    enqueue_orders(pg_dsn, [1, 2, 3], "q")
    status = outbox_cli("status", "--dsn", pg_dsn)
    assert status.returncode == 0 and status.stdout.startswith("pending 3 "), status
    bad = outbox_cli("relay", "--dsn", pg_dsn, "-b", "redis://127.0.0.1:1/1", "--batch-size", "0")
    assert bad.returncode == 2 and "--batch-size='0' is not an integer in 1..10000" in bad.stderr, bad
    no_dsn = outbox_cli("relay", env={"TASKHERD_OUTBOX_DSN": "", "DATABASE_URL": ""})
    assert no_dsn.returncode == 2 and "--dsn is required" in no_dsn.stderr, no_dsn


@pytest.mark.parametrize(("args", "env", "says"), [
    # checked before anything connects (the DSN points nowhere): was a traceback after connecting
    (["status", "--dsn", "postgresql://u:p@127.0.0.1:1/db", "--table", "bad name"], {},
     "--table='bad name' is not a table name (valid: an unquoted identifier"),
    (["migrate", "--dsn", "postgresql://u:p@127.0.0.1:1/db", "--table", "x;drop"], {}, "--table='x;drop' is not a table name"),
    # blank is not a DSN: libpq would read it as "the local socket, my user name"
    (["status", "--dsn", " "], {}, "--dsn is empty"),
    (["status"], {"TASKHERD_OUTBOX_DSN": "", "DATABASE_URL": "  "}, "--dsn is required"),
])
def test_cli_refuses_a_bad_table_or_a_blank_dsn_before_connecting(args, env, says):
    refused = outbox_cli(*args, env=env)
    assert refused.returncode == 2 and says in refused.stderr, refused
    assert "Traceback" not in refused.stderr, refused.stderr


def test_a_queue_the_broker_refuses_holds_only_its_rows_and_a_row_no_client_can_send_is_set_aside(
        broker_url, outbox_dsn, unique_name, monkeypatch):
    """Rows the real broker refuses every time failed their batch on every poll and, being the
    oldest, stopped every row behind them for good (a refusal was taken for an outage). A queue the
    broker refuses to this relay holds its own rows until it is mended; a row whose queue name
    py-amqp cannot send (over 255 bytes) is set aside with the reason; the other rows go on."""
    from celery import Celery
    from kombu import Connection

    monkeypatch.setattr(outbox, "HOLD_SECONDS", 1.0)
    amqp = broker_url.startswith("amqp")
    taken = f"{unique_name}-taken"
    with Connection(broker_url) as connection:
        if amqp:  # declared by another app as a quorum queue: Celery's classic declare gets 406
            connection.default_channel.queue_declare(taken, durable=True, auto_delete=False,
                                                     arguments={"x-queue-type": "quorum"})
        else:  # the queue's key holds something else: LPUSH gets WRONGTYPE
            connection.default_channel.client.set(taken, "not a list")
    good = enqueue_orders(outbox_dsn, [1], unique_name)
    held = enqueue_orders(outbox_dsn, [2, 3], taken)
    unsendable = enqueue_orders(outbox_dsn, [4], "q" * 300) if amqp else []
    behind = enqueue_orders(outbox_dsn, [9], unique_name)

    publisher = outbox.CeleryPublisher(app=Celery(broker=broker_url, set_as_current=False))
    relay = outbox.Relay(connect=lambda: psycopg.connect(outbox_dsn), publish=publisher.publish, batch_size=10)
    try:
        with pytest.raises(Exception) as refusal:  # once: the others relayed, what the broker said
            relay.run(once=True)
        assert ("PreconditionFailed" if amqp else "WRONGTYPE") in f"{type(refusal.value).__name__} {refusal.value}"

        assert rows(outbox_dsn, "SELECT count(*) FROM taskherd_outbox WHERE sent_at IS NOT NULL") == [(2,)]
        pending = dict(rows(outbox_dsn, "SELECT id::text, refused FROM taskherd_outbox WHERE sent_at IS NULL"))
        assert pending == {**{row_id: None for row_id in held}, **{row_id: pending.get(row_id) for row_id in unsendable}}
        if amqp:  # set aside, with what py-amqp said
            assert pending[unsendable[0]].startswith("this relay cannot send it: error: ubyte format"), pending
        with Connection(broker_url) as connection:  # mended: the other app's queue or key is gone
            if amqp:
                connection.default_channel.queue_delete(taken)
            else:
                connection.default_channel.client.delete(taken)
        time.sleep(1.2)  # the hold lapses: the queue is tried again
        assert relay.run(once=True) == 2
    finally:
        publisher.app.close()
    sent = {row_id for (row_id,) in rows(outbox_dsn, "SELECT id::text FROM taskherd_outbox WHERE sent_at IS NOT NULL")}
    assert sent == set(good + held + behind)
    with Connection(broker_url) as connection:  # really on the broker, each once
        channel = connection.default_channel
        for queue, count in ((unique_name, 2), (taken, 2)):
            assert [channel.basic_get(queue, no_ack=True) is not None for _ in range(count + 1)] == [True] * count + [False]


def test_relay_publishes_with_publisher_confirms_on_rabbitmq(amqp_url):
    from celery import Celery

    publisher = outbox.CeleryPublisher(app=Celery(broker=amqp_url, set_as_current=False))
    with publisher.app.producer_or_acquire() as producer:
        # py-amqp waits for the broker's basic.ack on every publish of a confirm-mode channel.
        assert producer.channel.basic_publish.__name__ == "basic_publish_confirm"
    publisher.app.close()


@pytest.mark.parametrize("broker", ["drops connections (full backlog)", "accepts and never answers"])
def test_a_relay_publish_to_a_redis_that_never_answers_fails_in_seconds(broker):
    # The chaos suite's broker restart on kind caught a relay waiting 140 s on one publish (kombu
    # connects and reads with no timeout) while committed rows piled up. A publish that fails
    # quickly is rolled back and relayed again on the next poll.
    import socket

    from celery import Celery

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    held = []
    if broker.startswith("drops"):
        # a full accept queue: the kernel drops every further SYN, as for a pod not there
        held.append(socket.create_connection(server.getsockname()))
    app = Celery(broker=f"redis://127.0.0.1:{server.getsockname()[1]}/0", set_as_current=False)
    app.conf.task_publish_retry = False  # one attempt: Celery's retries only multiply the wait
    publisher = outbox.CeleryPublisher(app=app)
    row = outbox.OutboxRow(id="r-1", task_name="t.noop", args=[], kwargs={}, queue="q")
    started = time.monotonic()
    try:
        with pytest.raises(Exception):  # redis-py's TimeoutError or kombu's OperationalError
            publisher.publish([row])
        waited = time.monotonic() - started
        limit = max(outbox.REDIS_PUBLISH_TIMEOUTS.values())
        assert waited < limit + 5, f"the publish failed only after {waited:.1f} s"
    finally:
        app.close()
        for s in held + [server]:
            s.close()

