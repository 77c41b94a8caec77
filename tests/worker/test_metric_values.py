"""taskherd's multiprocess value class: the files prometheus_client's collector reads, one lock for a
task's samples, a forked process's samples in files of its own."""
import os
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values

from taskherd import compat
from taskherd.worker import metric_values


@pytest.fixture
def multiprocess_dir(tmp_path, monkeypatch):
    """Metrics created inside write taskherd's multiprocess files under tmp_path; the process's
    value class and files are put back afterwards."""
    monkeypatch.setenv(metric_values.MULTIPROC_ENV, str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    monkeypatch.setattr(metric_values, "_files", {})
    monkeypatch.setattr(metric_values, "_values", [], raising=False)  # the class before values moved lazily
    compat.use_multiprocess_value_class()
    yield tmp_path
    for file in metric_values._files.values():
        file.close()


def collected(directory) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in registry.collect() for sample in family.samples}


def test_the_collector_reads_what_add_all_and_the_metric_objects_wrote(multiprocess_dir):
    tasks = Counter("tasks", "t", ["task"], registry=None)
    in_flight = Gauge("in_flight", "f", ["task"], registry=None, multiprocess_mode="livesum")
    runtime = Histogram("runtime", "r", ["task"], registry=None, buckets=(0.1, 1, 10))
    tasks.labels("a").inc()  # prometheus_client's own path, through the same value class
    runtime.labels("a").observe(0.5)
    total, buckets, bounds = compat.histogram_values(runtime.labels("a"))
    metric_values.add_all([(compat.sample_value(tasks.labels("a")), 2.0),
                           (compat.sample_value(in_flight.labels("a")), 1.0),
                           (total, 3.0), (buckets[2], 1.0)])  # 3.0 falls in the le=10 bucket
    assert bounds == (0.1, 1.0, 10.0, float("inf"))
    samples = collected(multiprocess_dir)
    assert samples[("tasks_total", (("task", "a"),))] == 3.0
    assert samples[("in_flight", (("task", "a"),))] == 1.0
    assert samples[("runtime_sum", (("task", "a"),))] == 3.5
    assert [samples[("runtime_bucket", (("le", le), ("task", "a")))] for le in ("0.1", "1.0", "10.0", "+Inf")] == \
        [0.0, 1.0, 2.0, 2.0]
    assert samples[("runtime_count", (("task", "a"),))] == 2.0


def test_threads_adding_to_the_same_samples_lose_nothing(multiprocess_dir):
    """The threads pool runs tasks in threads of one process: a task's samples are read, added to
    and written under the one lock the metric objects take too (a new series grows the file)."""
    counter = Counter("shared", "s", ["task"], registry=None)
    value = compat.sample_value(counter.labels("a"))

    def work(thread: int) -> None:
        for i in range(2000):
            metric_values.add_all([(value, 1.0)])
            if i % 100 == 0:
                counter.labels(f"new-{thread}-{i}").inc()  # a new key: the file grows, its mmap moves

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert collected(multiprocess_dir)[("shared_total", (("task", "a"),))] == 8000.0


def test_a_forked_process_writes_its_own_file_and_leaves_its_parents_alone(multiprocess_dir):
    counter = Counter("forked", "f", ["task"], registry=None)
    value = compat.sample_value(counter.labels("a"))
    metric_values.add_all([(value, 5.0)])
    pid = os.fork()
    if pid == 0:  # the child: its first add finds the fork and starts over in counter_<child>.db
        try:
            metric_values.add_all([(value, 1.0)])
            os._exit(0 if value.get() == 1.0 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's value did not start over at 0"
    assert value.get() == 5.0
    assert sorted(p.name for p in multiprocess_dir.iterdir()) == sorted(
        [f"counter_{os.getpid()}.db", f"counter_{pid}.db"])
    assert collected(multiprocess_dir)[("forked_total", (("task", "a"),))] == 6.0


def test_a_forked_process_creates_files_only_for_the_types_it_writes(multiprocess_dir):
    """The main process's max gauge (pool_child_last_death_timestamp_seconds) and its counters were
    re-pointed into every child at its first write, leaving a gauge_max_<child>.db of each recycled
    child behind, which nothing folds away: a child now opens only the file of what it writes."""
    counter = Counter("written", "w", ["task"], registry=None)
    last = Gauge("last", "l", ["task"], registry=None, multiprocess_mode="max")
    unused = Counter("unused_in_child", "u", ["task"], registry=None)
    last.labels("a").set(1700000000.0)
    unused.labels("a").inc()
    value = compat.sample_value(counter.labels("a"))
    metric_values.add_all([(value, 1.0)])
    children = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                metric_values.add_all([(value, 1.0)])
                os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        children.append(pid)
    parent = os.getpid()
    assert sorted(p.name for p in multiprocess_dir.iterdir()) == sorted(
        [f"counter_{parent}.db", f"gauge_max_{parent}.db"] + [f"counter_{pid}.db" for pid in children])
    samples = collected(multiprocess_dir)
    assert samples[("written_total", (("task", "a"),))] == 4.0
    assert samples[("unused_in_child_total", (("task", "a"),))] == 1.0
    assert samples[("last", (("task", "a"),))] == 1700000000.0


def test_a_value_first_used_in_a_child_after_the_fork_starts_at_zero_there(multiprocess_dir):
    gauge = Gauge("level", "l", ["task"], registry=None, multiprocess_mode="livesum")
    child_value = compat.sample_value(gauge.labels("a"))
    child_value.set(7.0)
    pid = os.fork()
    if pid == 0:
        try:
            ok = child_value.get() == 0.0  # the child's own file: nothing written there yet
            child_value.set(2.0)
            os._exit(0 if ok and child_value.get() == 2.0 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert child_value.get() == 7.0


def test_values_of_another_class_are_added_through_their_own_inc():
    """A metric created before the worker switched to multiprocess files (or a test's registry)."""
    counter = Counter("plain", "p", registry=CollectorRegistry())
    metric_values.add_all([(compat.sample_value(counter), 2.0)])
    assert counter._value.get() == 2.0
