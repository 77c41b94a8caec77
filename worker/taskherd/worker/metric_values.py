"""The value class of the worker's multiprocess metrics, and several samples written at once.

In a worker every metric sample lives in prometheus_client's multiprocess files: one per process
and type under ``PROMETHEUS_MULTIPROC_DIR`` (``counter_<pid>.db``, ``gauge_livesum_<pid>.db``, …),
one double per key in an mmap, which the main process's MultiProcessCollector reads back at each
scrape (taskherd.worker.components.metrics). :class:`MultiProcessValue` writes the same files,
keys and values as prometheus_client's own class of that name (``values.MultiProcessValue``), and
is installed in its place (``compat.use_multiprocess_value_class``).

What it adds is :func:`add_all`: the samples a task writes as it starts (in flight; the queue
wait's sum and bucket) and as it ends (outcome; runtime's sum and bucket; in flight) under one
lock and one check for a fork. Through the metric objects each sample took its own lock, its own
``getpid()`` and five layers of calls (``Histogram.observe`` a loop over the buckets besides): ~90k
instructions a no-op task in the pool child, a fifth of all the child's work on RabbitMQ
(cachegrind, docs/benchmarks.md). The metric objects still write through the same class, so both
paths share the lock, the files and each sample's value.

After a fork, a value moves to the new process's file on its first use there, not at the fork: a
pool child creates files only for the types it writes (counters, histograms, the live-sum gauge),
never one for a value it inherited but does not touch — the main process's
``pool_child_last_death_timestamp_seconds`` (a ``max`` gauge) left a ``gauge_max_<pid>.db`` of every
recycled child behind, and the counters the main process creates at 0 at start
(taskherd.worker.components.metrics) would have been copied into every child's file.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Iterable

from taskherd import compat

#: Where the files are; set by the worker's main process before its pool forks.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: One lock for every sample of the process, as prometheus_client's: a file grows (and its mmap is
#: replaced) when a new series appears, which must not happen under another thread's write.
_lock = threading.Lock()
#: The process the files below belong to; a pool child finds its parent's pid here after the fork.
_pid = os.getpid()
#: file prefix ("counter", "gauge_livesum", …) -> this process's open file
_files: dict[str, Any] = {}
#: bumped at each fork: a value whose own generation differs still points at its parent's file
_generation = 0


def _check_for_fork() -> None:
    """Under _lock: in a freshly forked process, every value starts over in files of its own
    (the parent's files keep the parent's samples; the collector sums them all) — each at its
    first use in this process (:meth:`MultiProcessValue._current`), so that a file is created only
    for a type this process writes."""
    global _pid, _generation
    pid = os.getpid()
    if pid == _pid:
        return
    _pid = pid
    for file in _files.values():
        file.close()
    _files.clear()
    _generation += 1


class MultiProcessValue:
    """One sample (a counter, a gauge, a histogram's sum or bucket) in this process's file."""

    _multiprocess = True  # as prometheus_client's own multiprocess class says of itself

    def __init__(self, typ: str, metric_name: str, name: str, labelnames: Iterable[str],
                 labelvalues: Iterable[str], help_text: str, multiprocess_mode: str = "", **_: Any):
        self._params = typ, metric_name, name, labelnames, labelvalues, help_text, multiprocess_mode
        with _lock:
            _check_for_fork()
            self._reset()

    def _current(self) -> None:
        """Under _lock, after _check_for_fork: re-points a value inherited from the parent."""
        if self._generation != _generation:
            self._reset()

    def _reset(self) -> None:
        typ, metric_name, name, labelnames, labelvalues, help_text, mode = self._params
        prefix = f"{typ}_{mode}" if typ == "gauge" else typ
        file = _files.get(prefix)
        if file is None:
            path = os.path.join(os.environ[MULTIPROC_ENV], f"{prefix}_{_pid}.db")
            file = _files[prefix] = compat.metric_file_writer(path)
        self._file = file
        self._key = compat.metric_key(metric_name, name, labelnames, labelvalues, help_text)
        self._value, self._timestamp = file.read_value(self._key)
        self._write = compat.sample_writer(file, self._key)
        self._generation = _generation

    def inc(self, amount: float) -> None:
        with _lock:
            _check_for_fork()
            self._current()
            self._value += amount
            self._timestamp = 0.0
            self._write(self._value)

    def set(self, value: float, timestamp: float | None = None) -> None:
        with _lock:
            _check_for_fork()
            self._current()
            self._value = value
            self._timestamp = timestamp or 0.0
            self._file.write_value(self._key, value, self._timestamp)

    def get(self) -> float:
        with _lock:
            _check_for_fork()
            self._current()
            return self._value

    def set_exemplar(self, exemplar: Any) -> None:
        return  # multiprocess mode has no exemplars (prometheus_client's class neither)

    def get_exemplar(self) -> None:
        return None


def add_all(updates: Iterable[tuple[Any, float]]) -> None:
    """Adds each amount to its value, given as (value, amount) pairs: values of
    :class:`MultiProcessValue` (``compat.sample_value``, ``compat.histogram_values``) under one lock
    and one fork check; any other value class (a metric created before the worker switched to
    multiprocess files, a test's registry) through its own ``inc``."""
    with _lock:
        _check_for_fork()
        generation = _generation
        for value, amount in updates:
            if value.__class__ is MultiProcessValue:
                if value._generation != generation:
                    value._reset()
                value._value += amount
                value._timestamp = 0.0
                value._write(value._value)
            else:
                value.inc(amount)

