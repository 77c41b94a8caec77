"""The crash-point matrix: a whole worker (or outbox relay) SIGKILLed at each step of a task's life,
on both brokers and both idempotency stores; the system recovers by itself; a ledger says what
became of each task.

Each cell is one task with a crash plan (apps.crash_points): the steps at which the process that
handles it kills its whole process group, once each. Every cell of a broker runs at the same time
on one pool of real `celery worker` processes (prefork, concurrency 1); a worker that dies is
replaced, as Kubernetes would; on Redis the FastRecovery lease (2 s here) brings a dead worker's
deliveries back, on RabbitMQ the closed connection does. A relay that dies is restarted.

The ledger of each cell, once everything is quiet:
- completed: SUCCESS in the result backend, the effect recorded exactly once, nothing in the DLQ;
- or dead-lettered: one or more envelopes for the task in the DLQ and no effect (the rows whose task
  fails: a permanent error, a hard time limit);
- every planned crash happened (recorded by the hook before the kill);
- nothing is left ready or unacknowledged in the work queue (nor in the Redis delay set).
The matrix (step x broker x store -> outcome) is printed at the end of the run and kept in
docs/reliability.md.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import redis
from celery import Celery
from celery.result import AsyncResult

from apps.effects_schema import create_tables
from e2e.lib.waiting import wait_for
from support.worker_process import TESTS_DIR, WorkerProcess
from taskherd.commands.dlq import open_dead_letters
from taskherd.queues import inspect_queues
from taskherd.worker import ProfileWarning, configure, outbox

from .conftest import MATRIX_KEY

pytestmark = pytest.mark.slow

STORES = ("redis", "postgres")
#: Workers kept alive per broker while the cells run (each dies at its cell's crash points).
WORKERS = 3
#: Seconds every cell has to reach its outcome.
DEADLINE = 240


@dataclasses.dataclass(frozen=True)
class Row:
    step: str
    plan: tuple[str, ...]
    fail: str | None = None
    options: tuple[tuple[str, object], ...] = ()
    via_outbox: bool = False
    brokers: tuple[str, ...] = ("redis", "rabbitmq")
    #: why the step does not exist on the other broker
    elsewhere: str = ""

    @property
    def dead_letters(self) -> bool:
        return self.fail in ("permanent", "hang")


ROWS = (
    Row("popped off the queue list", ("popped",), brokers=("redis",),
        elsewhere="n/a (RabbitMQ delivers and tracks in one step)"),
    Row("received", ("received",)),
    Row("delivery counted", ("received", "delivery counted")),  # only a redelivery is counted
    Row("key claimed", ("key claimed",)),
    Row("effect started", ("effect started",)),
    Row("effect committed", ("effect committed",)),
    Row("done-mark written", ("done-mark written",)),
    Row("result stored", ("result stored",)),
    Row("ack sent", ("ack sent",)),
    Row("retry being published", ("retry being published", "retry published"), fail="transient-first"),
    Row("envelope being published", ("envelope being published", "envelope published"), fail="permanent"),
    Row("hard-limit envelope published", ("hard-limit envelope published",), fail="hang",
        options=(("time_limit", 2), ("soft_time_limit", 1))),
    Row("ETA message parked", ("parked",), options=(("countdown", 5),), brokers=("redis",),
        elsewhere="n/a (RabbitMQ holds ETA messages)"),
    Row("outbox row committed, not relayed", ("row committed, not relayed",), via_outbox=True),
    Row("relay published, row not marked", ("relayed, row not marked",), via_outbox=True),
)


@dataclasses.dataclass
class Cell:
    row: Row
    broker: str
    store: str
    task_id: str = ""
    outcome: str = "?"
    ok: bool = False


class Column:
    """One broker: its queue, its workers and relay, and the cells it runs."""

    def __init__(self, broker: str, broker_url: str, redis_url: str, dsn: str, management_url: str | None,
                 log_dir, queue: str):
        self.broker, self.broker_url, self.redis_url, self.dsn = broker, broker_url, redis_url, dsn
        self.management_url, self.log_dir, self.queue = management_url, log_dir, queue
        self.outbox_table = f"outbox_{broker}"  # each broker's relay publishes only its own rows
        self.env = {"TEST_BROKER_URL": broker_url, "TEST_QUEUE": queue, "TEST_REDIS_URL": redis_url,
                    "TEST_PG_DSN": dsn, "TASKHERD_RECOVERY_TIMEOUT": "2", "TASKHERD_RECOVERY_HEARTBEAT_INTERVAL": "0.5"}
        self.redis = redis.Redis.from_url(redis_url)
        self.cells = [Cell(row, broker, store) for row in ROWS if broker in row.brokers for store in STORES]
        self.workers: list[WorkerProcess] = []
        self.relays: list = []
        self.started = 0
        self._starting = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # -- running ---------------------------------------------------------------------------------
    def producer(self) -> Celery:
        app = Celery("crash-producer", broker=self.broker_url, backend=self.redis_url, set_as_current=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileWarning)
            configure(app, queues=[self.queue], soft_time_limit=8, time_limit=10, backoff_base=0.2, backoff_cap=0.5)
        return app

    def submit(self, producer: Celery) -> None:
        # ETA messages first: taken at once by an idle worker, they are parked before they are due.
        for order, cell in sorted(enumerate(self.cells), key=lambda pair: "countdown" not in dict(pair[1].row.options)):
            args, options = [cell.store, order], dict(cell.row.options)
            if cell.row.fail:
                options["kwargs"] = {"fail": cell.row.fail}
            if cell.row.via_outbox:
                with psycopg.connect(self.dsn) as conn, conn.transaction():
                    cell.task_id = outbox.enqueue(conn, "crash.effect", args=args, queue=self.queue,
                                                  table=self.outbox_table)
                    self.redis.sadd(f"crash-plan:{cell.task_id}", *cell.row.plan)  # before the row is visible
            else:
                cell.task_id = str(uuid.uuid4())
                self.redis.sadd(f"crash-plan:{cell.task_id}", *cell.row.plan)
                producer.send_task("crash.effect", args=args, task_id=cell.task_id, queue=self.queue, **options)

    def start_worker(self) -> None:
        """Starts a worker (in the calling thread) and adds it to the pool once it is ready."""
        with self._lock:
            self.started += 1
            name = f"{self.broker}-{self.started}-{uuid.uuid4().hex[:4]}@%h"
        worker = WorkerProcess("apps.crash_app", log_dir=self.log_dir, queues=[self.queue], concurrency=1,
                               env=self.env, hostname=name)
        try:
            worker.start()
        except AssertionError:
            # It took a message and reached that message's crash point before it logged "ready.":
            # a crash like any other; the next worker picks the message up.
            worker.kill()
        else:
            with self._lock:
                self.workers.append(worker)
        finally:
            with self._lock:
                self._starting -= 1

    def start_relay(self) -> subprocess.Popen:
        """`taskherd outbox relay` itself, in a session of its own (its crash hook kills only it)."""
        log = open(self.log_dir / f"relay-{self.broker}-{len(self.relays)}.log", "ab")
        env = {**os.environ, **self.env,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))}
        relay = subprocess.Popen(
            [sys.executable, "-m", "taskherd.cli", "outbox", "relay", "--once", "--dsn", self.dsn, "--table",
             self.outbox_table, "-A", "apps.crash_app:app", "--batch-size", "1", "--poll-interval", "0.2"],
            env=env, cwd=TESTS_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.relays.append(relay)
        return relay

    def pending_rows(self) -> int:
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(f"SELECT count(*) FROM {self.outbox_table} WHERE sent_at IS NULL").fetchone()[0]

    def supervise(self) -> None:
        """Keeps WORKERS workers and, while rows are pending, one relay alive, until stopped."""
        while not self._stop.is_set():
            with self._lock:
                self.workers = [w for w in self.workers if w.is_running()]
                missing = WORKERS - len(self.workers) - self._starting
                self._starting += max(missing, 0)
            for _ in range(missing):  # replacements start side by side, as a ReplicaSet's would
                threading.Thread(target=self.start_worker, daemon=True).start()
            relay = self.relays[-1] if self.relays else None
            if (relay is None or relay.poll() is not None) and self.pending_rows():
                self.start_relay()
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()

    def shut_down(self) -> None:
        wait_for(f"the {self.broker} workers to finish starting (still starting)", lambda: self._starting, timeout=90,
                 equals=0)
        for relay in self.relays:
            if relay.poll() is None:
                relay.kill()
        for worker in self.workers:
            worker.stop(timeout=30)

    # -- the ledger ------------------------------------------------------------------------------
    def crashes(self) -> dict[str, list[str]]:
        steps: dict[str, list[str]] = {}
        for raw in self.redis.lrange("crashes", 0, -1):
            crash = json.loads(raw)
            steps.setdefault(crash["task_id"], []).append(crash["step"])
        return steps

    def effects(self, cell: Cell) -> int:
        if cell.store == "redis":
            return self.redis.llen(f"effects:{cell.task_id}")
        with psycopg.connect(self.dsn) as conn:
            return conn.execute("SELECT count(*) FROM ledger WHERE key = %s", (cell.task_id,)).fetchone()[0]

    def envelopes(self) -> dict[str, int]:
        from amqp.exceptions import NotFound

        store = open_dead_letters(self.broker_url, f"{self.queue}.dlq")
        try:
            letters = store.letters()
        except NotFound:
            letters = []
        finally:
            try:
                store.close()
            except Exception:  # noqa: BLE001 - a channel closed by NotFound
                pass
        counts: dict[str, int] = {}
        for letter in letters:
            counts[letter.task_id] = counts.get(letter.task_id, 0) + 1
        return counts

    def judge(self, app: Celery) -> None:
        crashes, envelopes = self.crashes(), self.envelopes()
        for cell in self.cells:
            state = AsyncResult(cell.task_id, app=app).state
            effects, letters = self.effects(cell), envelopes.get(cell.task_id, 0)
            runs = self.redis.llen(f"runs:{cell.task_id}")
            crashed = sorted(crashes.get(cell.task_id, []))
            if crashed != sorted(cell.row.plan):
                cell.outcome = (f"crashed at {crashed}, planned {list(cell.row.plan)} (effects {effects}, "
                                f"DLQ {letters}, {state}, runs {runs})")
            elif cell.row.dead_letters:
                cell.ok = letters >= 1 and effects == 0 and state != "SUCCESS"
                cell.outcome = (f"DLQ x{letters}, runs {runs}" if cell.ok else
                                f"{'LOST' if not letters else 'WRONG'}: DLQ {letters}, effects {effects}, {state}")
            else:
                cell.ok = state == "SUCCESS" and effects == 1 and letters == 0
                cell.outcome = (f"completed, runs {runs}" if cell.ok else
                                f"{'DUPLICATED' if effects > 1 else 'LOST' if not effects else 'WRONG'}: "
                                f"effects {effects}, DLQ {letters}, {state}")

    def resolved(self, app: Celery) -> bool:
        self.judge(app)
        return all(cell.ok for cell in self.cells)

    def leftovers(self) -> dict:
        """What is still in the work queue: ready, unacknowledged, parked (Redis). On RabbitMQ the
        management API's figures lag up to 5 s; once the workers are gone, `ready` from a passive
        declare is exact, and an unacknowledged message would have returned to it."""
        stats = inspect_queues(self.broker_url, [self.queue], management_url=self.management_url)[self.queue]
        left = {"ready": stats.ready, "unacked": stats.unacked}
        left["outbox rows not sent"] = self.pending_rows()
        if self.broker == "redis":
            left["delayed"] = self.redis.zcard("taskherd.delayed")
        elif not self.workers:
            from kombu import Connection

            with Connection(self.broker_url) as connection:
                _, ready, consumers = connection.default_channel.queue_declare(self.queue, passive=True)
            left.update(ready=ready, unacked=0, consumers=consumers)
        return left


def run_column(column: Column, app: Celery) -> None:
    supervisor = threading.Thread(target=column.supervise, name=f"supervise-{column.broker}", daemon=True)
    supervisor.start()
    try:
        wait_for(f"{WORKERS} {column.broker} workers", lambda: len(column.workers), timeout=120, equals=WORKERS)
        column.submit(app)
        wait_for(f"every {column.broker} cell to reach its outcome", lambda: column.resolved(app), timeout=DEADLINE,
                 interval=1, explain=lambda: "\n".join(f"{c.row.step} / {c.store}: {c.outcome}"
                                                        for c in column.cells if not c.ok))
        # Quiet twice, a statistics period apart: a duplicate still in flight shows up meanwhile.
        for _ in range(2):
            wait_for(f"the {column.broker} queue to be empty, nothing unacknowledged (what is left)",
                     column.leftovers, until=lambda left: not any(left.values()), timeout=60, interval=1)
            time.sleep(6)
    finally:
        column.stop()
        supervisor.join(timeout=60)
        column.shut_down()
    column.workers = []
    column.judge(app)
    left = column.leftovers()
    assert not any(left.values()), f"{column.broker}: left in {column.queue} after the workers stopped: {left}"


def matrix_lines(columns: list[Column]) -> list[str]:
    headers = [f"{column.broker} / {store} store" for column in columns for store in STORES]
    rows = []
    for row in ROWS:
        cells = []
        for column in columns:
            for store in STORES:
                found = [c for c in column.cells if c.row == row and c.store == store]
                cells.append(found[0].outcome if found else row.elsewhere)
        rows.append([row.step, *cells])
    widths = [max(len(str(r[i])) for r in [["step", *headers], *rows]) for i in range(len(headers) + 1)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(["step", *headers], widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return lines


def test_a_crash_at_any_step_loses_no_task_and_repeats_no_effect(request, redis_url, amqp_url, rabbitmq_api_url,
                                                                 pg_dsn, unique_name, tmp_path):
    create_tables(pg_dsn)
    # One Redis database and one PostgreSQL database serve both columns: task ids never collide.
    columns = [Column("redis", redis_url, redis_url, pg_dsn, None, tmp_path, f"{unique_name}-r"),
               Column("rabbitmq", amqp_url, redis_url, pg_dsn, rabbitmq_api_url, tmp_path, f"{unique_name}-a")]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for column in columns:
            outbox.create_table(conn, table=column.outbox_table)
    apps = [column.producer() for column in columns]
    started = time.monotonic()
    with ThreadPoolExecutor(len(columns)) as pool:
        failures = [f.exception() for f in [pool.submit(run_column, c, a) for c, a in zip(columns, apps)]]
    lines = matrix_lines(columns)
    lines.append(f"({sum(len(c.cells) for c in columns)} cells, {sum(c.started for c in columns)} worker starts, "
                 f"{sum(len(c.relays) for c in columns)} relay starts, {time.monotonic() - started:.0f} s)")
    request.config.stash.setdefault(MATRIX_KEY, []).extend(lines)
    for app in apps:
        app.close()
    for failure in failures:
        if failure is not None:
            raise failure
    bad = [f"{c.row.step} / {c.broker} / {c.store}: {c.outcome}" for column in columns for c in column.cells if not c.ok]
    assert not bad, "\n".join(bad)

