"""TimerHeap: the event loop drops the soft-time-limit timers of finished tasks, not 240 s later."""
from __future__ import annotations

import re

import pytest
from celery import Celery
from kombu.asynchronous.timer import Timer

from e2e.lib.waiting import wait_for
from support.worker_process import WorkerProcess
from taskherd import compat
from taskherd.worker.components import default_components
from taskherd.worker.components.timer_heap import TimerHeap, TimerHeapStep
from worker_support import core_env


def test_cancelled_timers_leave_the_heap_and_the_live_ones_still_fire_in_order():
    timer, fired = Timer(), []
    scheduler = iter(timer)  # the event loop's: it holds the heap's list while the sweep runs
    entries = [timer.call_at(100.0 + i, fired.append, (i,)) for i in range(50)]
    for i, entry in enumerate(entries):
        if i % 5:
            entry.cancel()
    assert next(scheduler) == (None, entries[0]), "the first live timer is due (its eta is long past)"

    assert compat.drop_cancelled_timers(timer) == 40
    assert len(timer.queue) == 9 and all(not event.entry.canceled for event in timer.queue)
    heap = timer._queue
    assert all(heap[i] <= heap[child] for i in range(len(heap)) for child in (2 * i + 1, 2 * i + 2)
               if child < len(heap)), "still a heap"
    due = []
    for delay, entry in scheduler:
        if entry is None:
            break
        due.append(entry.args[0])
    assert due == [5, 10, 15, 20, 25, 30, 35, 40, 45], "what is left fires, in eta order, from the same loop"
    assert compat.drop_cancelled_timers(timer) == 0
    assert compat.drop_cancelled_timers(object()) is None, "another kind of timer is left alone"


def test_the_component_is_installed_by_default_and_refuses_a_bad_interval():
    assert any(isinstance(component, TimerHeap) for component in default_components())
    assert TimerHeap(interval=0).problems() == ["TimerHeap(interval=0) must be a positive number of seconds"]
    assert TimerHeap(interval=float("nan")).problems()
    assert TimerHeap(interval=True).problems()
    app = Celery("timer-heap-test", set_as_current=False)
    TimerHeap().install(app)
    assert TimerHeapStep in app.steps["consumer"]


@pytest.mark.parametrize("broker_url", ["redis"], indirect=True)
def test_a_worker_drops_each_finished_tasks_timer_at_its_next_sweep(broker_url, record_url, unique_name,
                                                                    producer, recorded, tmp_path):
    """A real prefork worker with the profile's time limits (a soft limit of 200 s, so that no
    timer fires by itself): after 300 tasks, the sweeps (every 10 s) have dropped 300 timers."""
    env = core_env(broker_url, unique_name, record_url, soft_time_limit=200, time_limit=250)
    worker = WorkerProcess("apps.core_app", log_dir=tmp_path, queues=[unique_name], env=env,
                           extra_args=["--loglevel", "DEBUG"]).start()
    try:
        for i in range(300):
            producer.send_task("core.record", args=["done", str(i)], queue=unique_name)
        wait_for("300 tasks to run", lambda: len(recorded("done")), timeout=60, equals=300)

        def dropped() -> int:
            return sum(int(n) for n in re.findall(r"dropped (\d+) cancelled timers", worker.log()))
        wait_for("the sweeps to drop every finished task's timer", dropped, timeout=25, interval=0.5,
                 equals=300, explain=worker.tail)
    finally:
        worker.stop()
