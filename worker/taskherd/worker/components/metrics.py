"""Worker metrics for Prometheus, correct under the prefork pool.

Metrics (all labelled by ``task`` name):

- ``taskherd_tasks_total{task,outcome}`` — outcome is one of OUTCOMES. Every delivery that finishes
  counts exactly ONE final outcome: ``succeeded``, ``failed`` (a final failure that was not
  dead-lettered: a task of a class that does not dead-letter, a hard time limit or a lost pool
  process without late acks, a task's own ``Reject(requeue=False)``), ``dead_lettered`` (its
  envelope is in the DLQ: a final failure of a taskherd Task, or a message the worker could not run
  at all — taskherd.worker.components.bad_messages) or ``rejected`` (Celery's own rejection of a
  message it cannot run, without the BadMessages component; a bad message that could not be
  dead-lettered and was rejected into RabbitMQ's native dead-lettering). Besides, ``retried``
  counts each delivery that ended in a retry (a new message published). ``failed`` comes from
  Celery's ``task_failure`` signal, skipped for a delivery whose outcome is already counted
  (dead-lettered, or the second signal Celery sends for a hard time limit): see
  :func:`record_final_outcome`. The ``task`` label is the name of a task registered in the app, or
  ``unknown`` — never a name read from a message, which anyone could make unbounded
  (:func:`task_label`).
- ``taskherd_task_runtime_seconds`` — histogram, the task's run (its body, retries and failures
  included) timed in the pool child.
- ``taskherd_task_queue_wait_seconds`` — histogram, start of execution minus the moment the message
  became due: its publish stamp (header ``taskherd_published_at``, epoch seconds, set by
  taskherd.worker.stamping), or its ETA when later (``eta``, or ``taskherd_eta`` on a message
  parked in the Redis delay set): a countdown, or a retry's backoff, waits on purpose
  (:func:`due_at`). Messages without the stamp are skipped.
- ``taskherd_tasks_in_flight`` — gauge of tasks executing now (live-sum over pool children).
- ``taskherd_task_deliveries_total`` — messages received by the worker (redeliveries included), and
  the messages it dead-letters before they become a task. The invariant: deliveries − (the sum of
  all outcomes, ``retried`` included) = the deliveries that ended without an outcome (their pool
  process died, or the message went back to its queue) and were delivered again — never negative.
- ``taskherd_pool_child_deaths_total{task,cause}`` — pool processes that died under a task
  (taskherd.worker.child_deaths: ``OOMKilled``, ``SIGKILL``, ``SIGSEGV``, ``ExitCode<n>``), with
  ``taskherd_pool_child_last_death_timestamp_seconds{task,cause}``: recorded by the main process,
  the only trace of a child the OOM killer took while its container lived on.
- ``taskherd_heartbeat_timestamp_seconds`` — when the worker's main loop last wrote heartbeat.json
  (Unix time), 0 before its first write: ``time() - taskherd_heartbeat_timestamp_seconds`` is the
  age, and a worker that never started its loop alerts too (Prometheus exports timestamps, not ages).
- ``taskherd_worker_slots`` — tasks the worker runs at once (its pool's size, e.g. the prefork
  concurrency): with the runtime histogram's count and sum, the operator estimates the pool's
  throughput from it (Little's law, taskherd.operator.throughput).
- ``taskherd_build_info{version,celery,python}`` — always 1: which taskherd, Celery and Python run.

The counters' series of every registered task (Celery's own ``celery.*`` tasks aside) exist from
the worker's start at 0 — each outcome, the deliveries, and the pool child deaths of each cause
known in advance (child_deaths.KNOWN_CAUSES) — so that Prometheus's ``increase()`` sees the first
one too (:func:`create_known_series`): a series born at 1 has no increase.

Prefork: every process writes its samples to mmap files in a per-worker
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client multiprocess mode), set up in the MAIN process at
``worker_init`` — before the pool forks — and wiped there, since files of a previous run would be
summed in. A pool child creates files only for the types it writes (taskherd.worker.metric_values).
The main process serves ``/metrics`` on `port` (taskherd.contract.WORKER_METRICS_PORT), with
the HTTP probes ``/livez``, ``/readyz``, ``/startupz`` (taskherd.worker.components.probes), and, at every scrape,
marks dead children (``multiprocess.mark_process_dead``) so their live gauge files go away,
and folds their other files (counters, histograms, the sum/max/min/mostrecent gauges) into one
archive file per type: their values stay while the number of files stays bounded however often
children recycle.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import math
import os
import re
import shutil
import threading
import time
from bisect import bisect_left
from typing import Any, Iterable

from celery import Celery, signals
from celery.states import SUCCESS
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app, multiprocess
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from taskherd import compat, contract
from taskherd.build_info import build_info
from taskherd.pod import shared_files

from ..child_deaths import KNOWN_CAUSES
from ..delayed import ORIGINAL_ETA_HEADER as PARKED_ETA_HEADER  # a parked message's ETA (its `eta` removed)
from ..deliveries import header_timestamp
from ..metric_values import MULTIPROC_ENV, add_all
from ..task_messages import date_time_timestamp
from . import Component, installed, is_whole
from .heartbeat import Heartbeat
from .probes import ProbeEndpoints, serve
from .publish_stamps import PUBLISHED_AT_HEADER  # float epoch seconds

logger = logging.getLogger(__name__)

OUTCOMES = ("succeeded", "failed", "retried", "dead_lettered", "rejected")
#: The ``task`` label of a message that names no task registered in the app (or none at all).
UNKNOWN_TASK = "unknown"
#: The outcomes a message of an unknown task can have: created at 0 at start with the rest.
UNKNOWN_TASK_OUTCOMES = ("dead_lettered", "rejected")
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
QUEUE_WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)


class TaskMetrics:
    """The worker's metric objects. Tests pass a fresh `registry`; the worker uses None (multiprocess)."""

    def __init__(self, *, registry: CollectorRegistry | None = REGISTRY, namespace: str = "taskherd"):
        self.tasks = Counter("tasks", "Tasks by name and outcome.", ["task", "outcome"],
                             namespace=namespace, registry=registry)
        self.runtime = Histogram("task_runtime_seconds", "Task execution time in the pool, seconds.", ["task"],
                                 namespace=namespace, registry=registry, buckets=RUNTIME_BUCKETS)
        self.queue_wait = Histogram("task_queue_wait_seconds",
                                    "Start of execution minus the publish stamp, seconds.", ["task"],
                                    namespace=namespace, registry=registry, buckets=QUEUE_WAIT_BUCKETS)
        self.in_flight = Gauge("tasks_in_flight", "Tasks executing now.", ["task"], namespace=namespace,
                               registry=registry, multiprocess_mode="livesum")
        self.deliveries = Counter("task_deliveries", "Task messages received, redeliveries included.", ["task"],
                                  namespace=namespace, registry=registry)
        self.child_deaths = Counter("pool_child_deaths", "Pool processes that died under a task, by task and "
                                    "cause (OOMKilled, SIGKILL, SIGSEGV, ExitCode1, ...).", ["task", "cause"],
                                    namespace=namespace, registry=registry)
        self.last_child_death = Gauge("pool_child_last_death_timestamp_seconds",
                                      "When a pool process last died under the task, by cause (Unix time).",
                                      ["task", "cause"], namespace=namespace, registry=registry,
                                      multiprocess_mode="max")
        self._labelled: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._values: dict[tuple[str, tuple[str, ...]], Any] = {}

    def record_outcome(self, task_name: str, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome={outcome!r} for task {task_name!r} is not one of {', '.join(OUTCOMES)}")
        self.tasks.labels(task_name, outcome).inc()

    def labelled(self, metric: str, *labels: str) -> Any:
        """``getattr(self, metric).labels(*labels)``, looked up once per process: ``labels()``
        (label checks, a lock, a dict lookup) cost as much as the sample's own update, and the
        task path asks for five per task. Created on first use, as ``labels()`` would: a series
        that never happened does not appear."""
        key = (metric, labels)
        child = self._labelled.get(key)
        if child is None:
            child = self._labelled[key] = getattr(self, metric).labels(*labels)
        return child

    def value(self, metric: str, *labels: str) -> Any:
        """The value object of a labelled counter or gauge, for ``metric_values.add_all``."""
        key = (metric, labels)
        value = self._values.get(key)
        if value is None:
            value = self._values[key] = compat.sample_value(self.labelled(metric, *labels))
        return value

    def observation(self, metric: str, amount: float, *labels: str) -> tuple[tuple[Any, float], tuple[Any, float]]:
        """The two updates, for ``metric_values.add_all``, of observing ``amount`` in a labelled
        histogram: its sum, and the first bucket whose bound is >= amount (as ``observe``)."""
        key = (metric, labels)
        parts = self._values.get(key)
        if parts is None:
            parts = self._values[key] = compat.histogram_values(self.labelled(metric, *labels))
        total, buckets, bounds = parts
        return (total, amount), (buckets[bisect_left(bounds, amount)], 1.0)


_default: TaskMetrics | None = None
#: Set at worker_init (main process, inherited by the pool children): the Metrics component is on.
_recording = False
#: task id -> monotonic start, in the pool child running it (tasks timed by the signals).
_started: dict[str, float | None] = {}


def default_metrics() -> TaskMetrics:
    """The process's metrics (unregistered: in a worker, the multiprocess collector exposes them)."""
    global _default
    if _default is None:
        _default = TaskMetrics(registry=None)
    return _default


def record_outcome(task_name: str, outcome: str) -> None:
    """Counts one `outcome` (one of OUTCOMES) of task `task_name`. Safe in any process."""
    default_metrics().record_outcome(task_name, outcome)


#: task id -> None: the deliveries whose final outcome this process has counted, so that Celery's
#: task_failure signal(s) that follow add no second one (a dead-lettered task's failure; the two
#: signals of a hard time limit, from Request.on_failure and then on_timeout). Forgotten when the
#: next delivery of the id starts here (`forget_final_outcome`); bounded besides.
_final_outcomes: dict[str, None] = {}
_FINAL_OUTCOMES_KEPT = 4096


def record_final_outcome(task_name: str, task_id: Any, outcome: str) -> None:
    """Counts the final `outcome` of a delivery of task `task_name` (id `task_id`) and remembers
    that it has one: Celery's task_failure for the same delivery then counts nothing
    (:func:`_on_failure`). In the process that decided it, before Celery signals the failure."""
    record_outcome(task_name, outcome)
    if isinstance(task_id, str):
        _final_outcomes.pop(task_id, None)
        _final_outcomes[task_id] = None
        while len(_final_outcomes) > _FINAL_OUTCOMES_KEPT:
            del _final_outcomes[next(iter(_final_outcomes))]


def forget_final_outcome(task_id: Any) -> None:
    """A new delivery of `task_id` starts in this process: its outcome is still to be counted."""
    if _final_outcomes and isinstance(task_id, str):
        _final_outcomes.pop(task_id, None)


def task_label(name: Any, tasks: Any) -> str:
    """The ``task`` label of a message naming `name`: the name of a task registered in `tasks`
    (the app's registry), else ``unknown`` — a name read from the wire is whatever the producer
    wrote, and every new one would be a new series."""
    try:
        return name if isinstance(name, str) and tasks is not None and name in tasks else UNKNOWN_TASK
    except Exception:  # noqa: BLE001 - a registry that cannot answer: no name from the wire
        return UNKNOWN_TASK


#: Deliveries this process counted, ever: the consumer compares it before and after it hands a
#: message to Celery, to know whether a request was made (and counted) from it.
_deliveries_seen = 0


def deliveries_seen() -> int:
    return _deliveries_seen


def message_outcome(task_name: str, outcome: str, *, count_delivery: bool) -> None:
    """In the main process: the outcome of a message that became no task (dead-lettered or
    rejected as it arrived), and its delivery unless a request made from it counted it already —
    without the delivery, deliveries − outcomes would go negative. `task_name`: a :func:`task_label`."""
    global _deliveries_seen
    try:
        metrics = default_metrics()
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome={outcome!r} is not one of {', '.join(OUTCOMES)}")
        updates = [(metrics.value("tasks", task_name, outcome), 1.0)]
        if count_delivery:
            updates.append((metrics.value("deliveries", task_name), 1.0))
            _deliveries_seen += 1
        add_all(updates)
    except Exception:
        logger.exception("taskherd: could not count a %s message of %s in the metrics", outcome, task_name)


def create_known_series(metrics: TaskMetrics, task_names: Iterable[str]) -> int:
    """Creates at 0 the counter series of `task_names` known in advance: every outcome, the
    deliveries, the pool child deaths of every cause known in advance; and ``unknown``'s
    (:data:`UNKNOWN_TASK_OUTCOMES`, its deliveries). A series that appears at its first increment
    starts at 1, and Prometheus's ``increase()`` misses that first one (three OOM kills under three
    tasks looked like none). Returns the number of series."""
    created = 0
    for name in task_names:
        for outcome in OUTCOMES:
            metrics.labelled("tasks", name, outcome)
        metrics.labelled("deliveries", name)
        for cause in KNOWN_CAUSES:
            metrics.labelled("child_deaths", name, cause)
        created += len(OUTCOMES) + 1 + len(KNOWN_CAUSES)
    for outcome in UNKNOWN_TASK_OUTCOMES:
        metrics.labelled("tasks", UNKNOWN_TASK, outcome)
    metrics.labelled("deliveries", UNKNOWN_TASK)
    return created + len(UNKNOWN_TASK_OUTCOMES) + 1


def labelled_task_names(app: Celery) -> list[str]:
    """The app's registered tasks whose series are created at start: Celery's built-in
    ``celery.*`` tasks aside (as taskherd.worker.components.task_class leaves them aside), which
    most apps never run; theirs appear at first use."""
    return sorted(name for name in app.tasks.keys() if isinstance(name, str) and not name.startswith("celery."))


def published_at(request: Any) -> float | None:
    """The publish stamp of a task request (Celery puts custom headers on the request), or None
    when it has none or none readable: any producer can put anything in the header, and float()
    took Infinity, NaN, '1e999' and digits of other scripts ('١٢'), observing a queue wait of +Inf
    or NaN. Read by taskherd's one lenient reader (deliveries.header_timestamp): a finite number of
    epoch seconds, else the task counts as unstamped (no observation)."""
    value = getattr(request, PUBLISHED_AT_HEADER, None)
    if value is None:
        headers = getattr(request, "headers", None)
        value = headers.get(PUBLISHED_AT_HEADER) if isinstance(headers, dict) else None
    return header_timestamp(value)


def due_at(request: Any, *, timezone: Any = None) -> float | None:
    """When a task's message became due (epoch seconds): its ETA (``eta``, or ``taskherd_eta`` once
    parked in the Redis delay set, taskherd.worker.delayed), read as Celery reads it
    (task_messages.date_time_timestamp); None without one, or with one that cannot be read."""
    value = getattr(request, "eta", None)
    if not value:
        value = getattr(request, PARKED_ETA_HEADER, None)
    if not value:
        headers = getattr(request, "headers", None)
        value = headers.get(PARKED_ETA_HEADER) if isinstance(headers, dict) else None
    if not value:
        return None
    try:
        due = date_time_timestamp(value, timezone=timezone)
    except Exception:  # noqa: BLE001 - any producer can put anything there: no reading, no wait
        return None
    return due if due is not None and math.isfinite(due) else None


def queue_wait(request: Any, *, now: float, timezone: Any = None) -> float | None:
    """Seconds `request` waited in the queue after it became due: from its publish stamp, or from
    its ETA when that is later (a countdown or a retry's backoff is no wait); None if unstamped."""
    stamp = published_at(request)
    if stamp is None:
        return None
    due = due_at(request, timezone=timezone)
    return max(0.0, now - (stamp if due is None else max(stamp, due)))


# -- the multiprocess directory ------------------------------------------------------------------
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_multiprocess_dir(*, base: str | None = None, pid: int | None = None) -> str:
    """Chooses, wipes and exports this worker's PROMETHEUS_MULTIPROC_DIR; returns it.

    An explicit $PROMETHEUS_MULTIPROC_DIR is used as is. Otherwise <base>/worker-<pid>, and the
    directories of dead workers under <base> are removed.
    """
    pid = os.getpid() if pid is None else pid
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        base = base or os.path.join(shared_files.heartbeat_dir(), "prometheus")
        os.makedirs(base, exist_ok=True)
        for stale in glob.glob(os.path.join(base, "worker-*")):
            match = re.fullmatch(r"worker-(\d+)", os.path.basename(stale))
            if match and int(match.group(1)) != pid and not _pid_alive(int(match.group(1))):
                shutil.rmtree(stale, ignore_errors=True)
        directory = os.path.join(base, f"worker-{pid}")
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory, exist_ok=True)
    os.environ[MULTIPROC_ENV] = directory
    compat.use_multiprocess_value_class()
    return directory


def mark_dead_processes(directory: str) -> list[int]:
    """Removes the live-gauge files of processes that no longer exist; returns their pids."""
    dead = set()
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        pid = int(path.rsplit("_", 1)[1][:-3])
        if not _pid_alive(pid):
            dead.add(pid)
    for pid in dead:
        multiprocess.mark_process_dead(pid, directory)
    return sorted(dead)


#: How the values of dead processes' files fold into an archive, by file type ("gauge_<mode>"):
#: None keeps the latest timestamp's (mostrecent). The live modes' files are removed at death
#: (mark_dead_processes); "all" keeps a series per pid, so its files are left as they are.
_FOLDS = {"counter": sum, "histogram": sum, "gauge_sum": sum, "gauge_max": max, "gauge_min": min,
          "gauge_mostrecent": None}


def compact_dead_processes(directory: str) -> int:
    """Folds the files of dead processes into one archive file per type (:data:`_FOLDS`).

    Without this, every recycled pool child (max_tasks_per_child) leaves its files behind and every
    scrape reads them all. Values are combined key by key (labels and histogram buckets included) —
    summed, or the max, min or most recent for gauges of those modes — into ``<type>_archive.db``,
    written to a temporary name and renamed, then the dead files are removed. Only the main process
    does this, under the collector's lock; if it dies half-way the whole directory is wiped at the
    next start anyway. Returns the number of files folded.
    """
    dead: dict[str, list[str]] = {}
    for path in glob.glob(os.path.join(directory, "*.db")):
        parts = os.path.basename(path)[:-3].split("_")
        kind = "_".join(parts[:-1])
        if kind not in _FOLDS or not parts[-1].isdigit() or _pid_alive(int(parts[-1])):
            continue
        dead.setdefault(kind, []).append(path)
    for kind, paths in dead.items():
        archive = os.path.join(directory, f"{kind}_archive.db")
        fold = _FOLDS[kind]
        folded: dict[str, tuple[float, float]] = {}
        for path in ([archive] if os.path.exists(archive) else []) + paths:
            for key, value, timestamp, _position in compat.read_metric_file(path):
                if key not in folded:
                    folded[key] = (value, timestamp)
                elif fold is None:
                    if timestamp >= folded[key][1]:
                        folded[key] = (value, timestamp)
                else:
                    folded[key] = (fold((folded[key][0], value)), 0.0)
        temporary = archive + ".tmp"  # not *.db: the collector never reads it
        merged = compat.metric_file_writer(temporary)
        for key, (value, timestamp) in folded.items():
            merged.write_value(key, value, timestamp)
        merged.close()
        os.replace(temporary, archive)
        for path in paths:
            os.remove(path)
    return sum(len(paths) for paths in dead.values())


def heartbeat_timestamp(record: dict[str, Any] | None) -> GaugeMetricFamily:
    """``taskherd_heartbeat_timestamp_seconds`` from a heartbeat record (None: never written, 0)."""
    family = GaugeMetricFamily("taskherd_heartbeat_timestamp_seconds",
                               "When the worker's main loop last wrote its heartbeat (Unix time); 0 before the first.")
    written_at = (record or {}).get("written_at")
    try:
        family.add_metric([], float(written_at) if written_at else 0.0)
    except (TypeError, ValueError):
        family.add_metric([], 0.0)
    return family


def worker_slots(consumer: Any) -> int | None:
    """Tasks the worker runs at once: its pool's limit (the concurrency; 1 for the solo pool)."""
    for owner, name in ((getattr(consumer, "pool", None), "limit"),
                        (getattr(consumer, "controller", None), "concurrency")):
        value = getattr(owner, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


class WorkerCollector(Collector):
    """What /metrics serves: every process's samples, the heartbeat time, the worker's slots and
    the build info."""

    def __init__(self, *, directory: str, heartbeat_path: str, slots: int | None = None):
        self.directory, self.heartbeat_path, self.slots = directory, heartbeat_path, slots
        self.multiprocess = multiprocess.MultiProcessCollector(None, path=directory)
        # Scrapes may come concurrently (threaded HTTP server); compaction must not remove a
        # file another scrape is about to read.
        self.lock = threading.Lock()

    def collect(self) -> Iterable[Any]:
        with self.lock:
            mark_dead_processes(self.directory)
            try:
                compact_dead_processes(self.directory)
            except OSError:
                logger.exception("taskherd: could not compact the metrics of dead pool processes")
            families = list(self.multiprocess.collect())
        yield from families
        try:
            record = shared_files.read_json(self.heartbeat_path)
        except (OSError, ValueError):
            record = None
        yield heartbeat_timestamp(record)
        if self.slots is not None:
            yield GaugeMetricFamily("taskherd_worker_slots", "Tasks this worker runs at once (its pool's size).",
                                    value=self.slots)
        yield build_info()


# -- Celery wiring -------------------------------------------------------------------------------
def _task_name(sender: Any, task: Any = None) -> str:
    return getattr(task or sender, "name", None) or "unknown"


def recording() -> bool:
    """Whether this process is a worker's (or its pool child's) with the Metrics component."""
    return _recording


def task_started(task: Any, request: Any = None) -> float | None:
    """In the process running the task, as its body starts: one more in flight, and its queue
    wait (from the publish stamp of `request`, the task's current request by default). Returns the
    start (monotonic) for `task_ended`; None if the samples could not be written (logged: a metric
    never fails a task). The taskherd Task calls this and `task_ended` itself
    (taskherd.worker.task), so Celery's task_prerun and task_postrun have no receiver and the tracer
    does not dispatch them (`_per_task_signals`)."""
    try:
        metrics, name = default_metrics(), task.name
        request = task.request if request is None else request
        forget_final_outcome(getattr(request, "id", None))
        in_flight = (metrics.value("in_flight", name), 1.0)
        waited = queue_wait(request, now=time.time(), timezone=_timezone_of(task))
        if waited is None:
            add_all((in_flight,))
        else:
            add_all((in_flight, *metrics.observation("queue_wait", waited, name)))
        return time.monotonic()
    except Exception:
        logger.exception("taskherd: could not record the start of %s in its metrics", getattr(task, "name", task))
        return None


def _timezone_of(task: Any) -> Any:
    """The app's time zone, in which Celery reads a naive ETA; None (UTC) if it has none."""
    try:
        return task.app.timezone
    except Exception:  # noqa: BLE001 - a task without an app: a naive ETA reads as UTC
        return None


def task_ended(task: Any, started: float | None, *, succeeded: bool) -> None:
    """In the process running the task, as its body ended (raised or returned) after `task_started`."""
    if started is None:
        return
    try:
        metrics, name = default_metrics(), task.name
        updates = [*metrics.observation("runtime", time.monotonic() - started, name),
                   (metrics.value("in_flight", name), -1.0)]
        if succeeded:
            updates.append((metrics.value("tasks", name, "succeeded"), 1.0))
        add_all(updates)
    except Exception:
        logger.exception("taskherd: could not record the end of %s in its metrics", getattr(task, "name", task))


def delivery_received(task_name: str, task_id: Any = None) -> None:
    """In the main process, as a message becomes a task request: one more delivery of the task
    (redeliveries included), whose outcome is still to be counted. taskherd's Request calls it; for
    a task of another Request class, Celery's task_received signal does (`_per_task_signals`)."""
    global _deliveries_seen
    if not _recording:
        return
    forget_final_outcome(task_id)
    _deliveries_seen += 1
    try:
        add_all(((default_metrics().value("deliveries", task_name), 1.0),))
    except Exception:
        logger.exception("taskherd: could not count a delivery of %s in its metrics", task_name)


def records_its_own_metrics(task: Any) -> bool:
    """Whether `task` calls `task_started`/`task_ended` itself (a taskherd Task run by a worker)."""
    return bool(getattr(task, "records_its_own_metrics", False))


def counts_its_deliveries(task: Any) -> bool:
    """Whether the main process's request of `task` calls `delivery_received` itself (its Request
    class says ``counts_its_delivery``, as taskherd.worker.task.Request)."""
    from celery.utils.imports import symbol_by_name

    try:
        request_class = symbol_by_name(getattr(task, "Request", None) or "celery.worker.request:Request")
    except (ImportError, AttributeError, ValueError):
        return False
    return bool(getattr(request_class, "counts_its_delivery", False))


# The same two records from Celery's signals, for tasks that do not record their own (a class of
# the app's own that is no taskherd Task): connected only while such a task is registered.
def _on_prerun(sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
    task = task or sender
    if _recording and task is not None and not records_its_own_metrics(task):
        _started[task_id] = task_started(task)


def _on_postrun(sender: Any = None, task_id: str | None = None, task: Any = None, state: str | None = None,
                **_: Any) -> None:
    task = task or sender
    started = _started.pop(task_id, None)
    if task is not None and started is not None:
        task_ended(task, started, succeeded=state == SUCCESS)


def start_recording(app: Celery, *, base: str | None = None) -> str:
    """What the Metrics component does at worker_init, in the main process before the pool forks:
    a fresh multiprocess directory (returned), the process's metric objects, the per-task
    records switched on, and the series known in advance created at 0 (:func:`create_known_series`,
    written to the main process's files only). The children inherit all of it."""
    global _default, _recording
    directory = prepare_multiprocess_dir(base=base)
    _default = TaskMetrics(registry=None)
    _recording = True
    _per_task_signals(app)
    try:
        create_known_series(_default, labelled_task_names(app))
    except Exception:
        logger.exception("taskherd: could not create the task series at 0; each appears at its first count")
    return directory


def _per_task_signals(app: Celery) -> None:
    """Connects task_prerun/task_postrun only if a task of `app` does not record its own metrics,
    and task_received only if the request of one does not count its own deliveries: each dispatch
    costs a few µs per task even when its receiver returns at once. Called in the main process at
    worker_init, after the app's task modules were imported and before the pool forks, so the
    children inherit the choice."""
    tasks = list(app.tasks.values())
    timed_by_signals = any(not records_its_own_metrics(task) for task in tasks)
    counted_by_signal = any(not counts_its_deliveries(task) for task in tasks)
    for signal, handler, connect in ((signals.task_prerun, _on_prerun, timed_by_signals),
                                     (signals.task_postrun, _on_postrun, timed_by_signals),
                                     (signals.task_received, _on_received, counted_by_signal)):
        uid = f"taskherd.metrics.{signal.name}"
        if connect:
            signal.connect(handler, weak=False, dispatch_uid=uid)
        else:
            signal.disconnect(handler, dispatch_uid=uid)


def _on_failure(sender: Any = None, task_id: Any = None, **_: Any) -> None:
    """A final failure, unless this delivery's outcome is already counted (dead-lettered, or the
    second task_failure Celery sends for one hard time limit)."""
    if isinstance(task_id, str) and task_id in _final_outcomes:
        return
    record_final_outcome(_task_name(sender), task_id, "failed")


def _on_retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    record_outcome(_task_name(sender) if sender is not None else getattr(request, "task", "unknown"), "retried")


def _on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    if not getattr(request, "counts_its_delivery", False):  # taskherd's Request has counted it
        delivery_received(getattr(request, "name", None) or "unknown", getattr(request, "id", None))


def _registry_of(consumer: Any) -> Any:
    return getattr(getattr(consumer, "app", None), "tasks", None)


def _on_rejected(sender: Any = None, message: Any = None, **_: Any) -> None:
    """Celery rejected a message it could not turn into a task (no request was made: no delivery
    counted yet). Without the BadMessages component only: its consumer dead-letters instead."""
    headers = getattr(message, "headers", None)
    name = headers.get("task") if isinstance(headers, dict) else None
    message_outcome(task_label(name, _registry_of(sender)), "rejected", count_delivery=True)


def _on_unknown(sender: Any = None, name: Any = None, **_: Any) -> None:
    """Celery rejected a message naming a task it does not have (no request: no delivery counted)."""
    message_outcome(task_label(name, _registry_of(sender)), "rejected", count_delivery=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Metrics(Component):
    """Records task metrics in the app's workers and serves them from the main process.

    Nothing happens at install time beyond connecting signals: a producer importing the app never
    touches the worker's files or ports.
    """

    environment = {"TASKHERD_METRICS_PORT": "port", "TASKHERD_METRICS_ADDR": "address",
                   "TASKHERD_METRICS_DIR": "directory"}

    #: port of /metrics and of the HTTP probes; 0: no HTTP server (the samples are still recorded)
    port: int = contract.WORKER_METRICS_PORT
    #: address /metrics listens on
    address: str = "0.0.0.0"
    #: parent of the per-worker multiprocess directories; None: <heartbeat dir>/prometheus
    directory: str | None = None

    def problems(self) -> list[str]:
        problems = []
        if not (is_whole(self.port) and 0 <= self.port <= 65535):
            problems.append(f"Metrics(port={self.port!r}) is not a port number (valid: 0-65535, 0 disables the server)")
        try:
            contract.listen_address(self.address if isinstance(self.address, str) else "")
        except ValueError:
            problems.append(f"Metrics(address={self.address!r}) is not an address to listen on (valid: an IP "
                            f"address or host name; 0.0.0.0: all)")
        return problems

    def install(self, app: Celery, profile: Any = None) -> None:
        port, addr, directory = self.port, self.address, self.directory
        state: dict[str, Any] = {}

        def on_worker_init(sender: Any = None, **_: Any) -> None:  # main process, before the pool forks
            if getattr(sender, "app", app) is not app:
                return
            state["directory"] = start_recording(app, base=directory)

        def on_worker_ready(sender: Any = None, **_: Any) -> None:  # main process, consumer connected
            if getattr(sender, "app", app) is not app or not port or "server" in state or "directory" not in state:
                return
            heartbeat = installed(app, Heartbeat)
            heartbeat_path = shared_files.heartbeat_path(heartbeat.resolved_directory if heartbeat else None)
            registry = compat.filterable_registry()  # the operator asks for its few series only
            registry.register(WorkerCollector(directory=state["directory"], heartbeat_path=heartbeat_path,
                                              slots=worker_slots(sender)))
            # One server for /metrics and the kubelet's HTTP probes (taskherd.worker.components.probes).
            try:
                state["server"] = serve(ProbeEndpoints(make_wsgi_app(registry), heartbeat_path=heartbeat_path),
                                        port=port, address=addr)
            except OSError as exc:
                # The worker runs on (tasks are safe without it), but its HTTP probes cannot pass:
                # say so in the words the user set it with.
                logger.critical("taskherd: cannot serve /metrics and the HTTP probes on %s:%d: %s — the kubelet's "
                                "httpGet probes will fail; set TASKHERD_METRICS_PORT (Metrics(port=…)) to a free "
                                "port, or 0 for no server, and TASKHERD_METRICS_ADDR (Metrics(address=…)) to an "
                                "address of this host", addr, port, exc)
                return
            logger.info("taskherd: metrics and probes (/livez, /readyz, /startupz) on http://%s:%d (multiprocess "
                        "dir %s)", addr, port, state["directory"])

        uid = f"taskherd.metrics.{id(app)}"
        signals.worker_init.connect(on_worker_init, weak=False, dispatch_uid=uid + ".init")
        signals.worker_ready.connect(on_worker_ready, weak=False, dispatch_uid=uid + ".ready")
        for signal, handler in ((signals.task_prerun, _on_prerun), (signals.task_postrun, _on_postrun),
                                (signals.task_failure, _on_failure),
                                (signals.task_retry, _on_retry),
                                (signals.task_rejected, _on_rejected), (signals.task_unknown, _on_unknown)):
            signal.connect(handler, weak=False, dispatch_uid=f"taskherd.metrics.{signal.name}")
