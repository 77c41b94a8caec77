"""The producers: what a scenario sends, and the record of what the broker (or the database) took.

`plan()` is pure: the tasks of a scenario from its Load and a seeded random generator — keys,
kinds (normal or poison), which idempotency store guards each, how long each works and which path
publishes it. `Producer` publishes them as a web server would, from this host:

- **directly**: `send_task` with the task id chosen here (publisher confirms on RabbitMQ); a publish
  that raises is tried again with the same task id until confirmed, so a message that did reach the
  broker is the same task as its retry;
- **through the transactional outbox**: the request row and the outbox row in one PostgreSQL
  transaction; the relay in the cluster publishes it. A commit whose outcome is unknown is settled
  by looking for the request row.

Each task is recorded as a checker.SentTask: confirmed, or indeterminate when no try could be
confirmed before the producer gave up.
"""
from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
import psycopg

from .checker import SentTask
from .spec import Load

log = logging.getLogger("taskherd.e2e.chaos.workload")

#: megabytes the OOM poison builds: twice the worker's memory limit (e2e/chaos/app/values.yaml)
OOM_MEGABYTES = 512
#: how long one task keeps being retried before it is left indeterminate
PUBLISH_PATIENCE_SECONDS = 180

REQUESTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_requests (
    key         text PRIMARY KEY,
    task_id     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)"""


@dataclass(frozen=True)
class TaskSpec:
    key: str
    kind: str
    store: str
    seconds: float
    path: str

    def kwargs(self) -> dict:
        extra = {"megabytes": OOM_MEGABYTES} if self.kind == "oom" else {}
        return {"key": self.key, "store": self.store, "seconds": self.seconds, "kind": self.kind, **extra}


def plan(prefix: str, load: Load, rng: random.Random, *, count: int | None = None, start: int = 0,
         poison: dict[str, int] | None = None) -> list[TaskSpec]:
    """`count` tasks (default load.tasks) numbered from `start`, with `poison` (default the load's)
    spread among them. Poison never goes through the outbox path alone: its path is drawn like any."""
    count = load.tasks if count is None else count
    kinds = [kind for kind, n in (poison if poison is not None else load.poison()).items() for _ in range(n)]
    positions = set(rng.sample(range(count), min(len(kinds), count))) if count else set()
    kinds_at = dict(zip(sorted(positions), kinds))
    tasks = []
    for i in range(start, start + count):
        tasks.append(TaskSpec(
            key=f"{prefix}-{i:05d}",
            kind=kinds_at.get(i - start, "normal"),
            store="postgres" if i % 2 == 0 else "redis",
            seconds=rng.choice(load.durations),
            path="outbox" if rng.random() < load.outbox_share else "direct",
        ))
    return tasks


class Trickle:
    """Normal tasks after the burst, numbered on from it, one path at a time (thread-safe)."""

    def __init__(self, prefix: str, load: Load, rng: random.Random, *, start: int):
        self.prefix, self.load, self.rng, self.next_number = prefix, load, rng, start
        self._lock = threading.Lock()

    def next(self, path: str) -> TaskSpec:
        with self._lock:
            number, self.next_number = self.next_number, self.next_number + 1
            seconds = self.rng.choice(self.load.durations)
        return TaskSpec(key=f"{self.prefix}-{number:05d}", kind="normal",
                        store="postgres" if number % 2 == 0 else "redis", seconds=seconds, path=path)


class Producer:
    """Publishes TaskSpecs on both paths, each from its own thread, and records every outcome."""

    def __init__(self, *, app, database_url: str, queue: str, task_name: str):
        from taskherd.worker import outbox

        self.app, self.database_url, self.queue, self.task_name = app, database_url, queue, task_name
        self._outbox = outbox
        self.sent: list[SentTask] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(REQUESTS_SCHEMA)

    # --- one task, either path ---------------------------------------------------------------------

    def publish(self, task: TaskSpec) -> SentTask:
        send = self._direct if task.path == "direct" else self._through_outbox
        deadline = time.monotonic() + PUBLISH_PATIENCE_SECONDS
        task_id, last_error = str(uuid.uuid4()), None
        while True:
            try:
                confirmed_id = send(task, task_id)
                record = SentTask(task.key, confirmed_id, task.kind, task.store, task.path, True, time.time())
                break
            except Exception as exc:  # noqa: BLE001 - any failure leaves the outcome unknown; try again
                last_error = exc
                if time.monotonic() > deadline:
                    record = SentTask(task.key, task_id, task.kind, task.store, task.path, False, time.time())
                    self.errors.append(f"{task.key} ({task.path}): indeterminate after {exc!r}")
                    break
                time.sleep(0.5)
        if last_error is not None:
            log.info("%s (%s) published after retries; last error %r", task.key, task.path, last_error)
        with self._lock:
            self.sent.append(record)
        return record

    def _direct(self, task: TaskSpec, task_id: str) -> str:
        self.app.send_task(self.task_name, kwargs=task.kwargs(), task_id=task_id, queue=self.queue)
        return task_id

    def _through_outbox(self, task: TaskSpec, _task_id: str) -> str:
        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            existing = conn.execute("SELECT task_id FROM ledger_requests WHERE key = %s", (task.key,)).fetchone()
            if existing:  # an earlier try committed, and only its answer was lost
                return existing[0]
            with conn.transaction():
                task_id = self._outbox.enqueue(conn, self.task_name, kwargs=task.kwargs(), queue=self.queue)
                conn.execute("INSERT INTO ledger_requests (key, task_id) VALUES (%s, %s)", (task.key, task_id))
            return task_id

    # --- a stream ------------------------------------------------------------------------------------

    def start(self, burst: list[TaskSpec], trickle: Trickle | None, rate: float, outbox_share: float) -> None:
        """Publishes `burst` at once, then the trickle's tasks at `rate` per second in all until stop();
        each path in its own thread, so a database outage does not hold up direct publishing."""
        for path, share in (("direct", 1 - outbox_share), ("outbox", outbox_share)):
            mine = [t for t in burst if t.path == path]
            thread = threading.Thread(target=self._stream, args=(mine, trickle, rate * share, path), daemon=True,
                                      name=f"chaos-producer-{path}")
            self._threads.append(thread)
            thread.start()

    def _stream(self, burst: list[TaskSpec], trickle: Trickle | None, rate: float, path: str) -> None:
        for task in burst:
            self.publish(task)
        if trickle is None or rate <= 0:
            return
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.publish(trickle.next(path))
            next_at += interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self, timeout: float = PUBLISH_PATIENCE_SECONDS + 30) -> None:
        """Ends the stream; returns once every task in hand has a recorded outcome."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout)

    def records(self) -> list[SentTask]:
        with self._lock:
            return list(self.sent)
