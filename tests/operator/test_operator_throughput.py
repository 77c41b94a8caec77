"""The pool's throughput from its workers' counters: monotonic across pods that come, go and restart."""
from __future__ import annotations

import pytest

from taskherd.operator.deletion_cost import PodBusyness
from taskherd.operator.scaling import Decision, Recommendation
from taskherd.operator.throughput import STEADY_READING_SECONDS, WorkCounters, reading_due


def pod(name, completed, busy=None, *, slots=2, running=True):
    return PodBusyness(name, 0, running=running, completed=completed,
                       busy_seconds=completed * 1.0 if busy is None else busy, slots=slots)


def test_only_increments_count_not_what_a_pod_had_counted_before_it_was_first_read():
    counters = WorkCounters().read([pod("a", 100)], depth=0, now=0)
    assert counters.completed == 0, "a's 100 tasks may be from before the window"
    counters = counters.read([pod("a", 110), pod("b", 50)], depth=0, now=10)
    assert counters.completed == 10, "b is new: from its next reading on"
    counters = counters.read([pod("a", 112), pod("b", 55)], depth=0, now=20)
    assert (counters.completed, counters.busy_seconds) == (17, 17.0)


def test_a_restarted_worker_counts_again_from_zero_and_a_gone_pod_takes_nothing_back():
    counters = WorkCounters().read([pod("a", 100), pod("b", 40)], depth=0, now=0)
    counters = counters.read([pod("a", 3)], depth=0, now=10)  # a restarted, b gone
    assert counters.completed == 3
    counters = counters.read([pod("a", 5), pod("b", 1)], depth=0, now=20)  # b is a new pod now
    assert counters.completed == 5
    assert [s.completed for s in counters.samples] == [0, 3, 5], "monotonic"


def test_pods_not_running_or_without_counters_are_left_out():
    counters = WorkCounters().read([pod("a", 10), pod("b", 10, running=False)], depth=0, now=0)
    counters = counters.read([pod("a", 20), pod("b", 90, running=False),
                              PodBusyness("c", 0)], depth=0, now=10)
    assert counters.completed == 10 and set(counters.per_pod) == {"a"}


def test_throughput_is_arrivals_and_service_time_over_the_readings():
    counters = WorkCounters()
    for at, done, depth in ((0, 0, 10), (15, 30, 10), (30, 60, 10)):  # 2 tasks/s of 1 s, depth steady
        counters = counters.read([pod("a", 1000 + done)], depth=depth, now=at)
    throughput = counters.throughput(now=30)
    assert throughput.arrival_rate == pytest.approx(2.0) and throughput.service_seconds == pytest.approx(1.0)
    assert throughput.workers_needed == 1, "2 tasks/s x 1 s = 2 busy slots = one worker of 2 slots"
    assert counters.throughput(now=30 + 61) is None, "readings older than the window say nothing"


def test_no_throughput_from_workers_that_do_not_export_their_slots():
    counters = WorkCounters().read([pod("a", 0, slots=None)], depth=0, now=0)
    counters = counters.read([pod("a", 20, slots=None)], depth=0, now=10)
    assert counters.throughput(now=10) is None


def decision(replicas, recommended=None):
    return Decision(replicas, "why", Recommendation(0, replicas if recommended is None else recommended))


@pytest.mark.parametrize("made,current,depth,last,due", [
    (decision(5), 3, 0, None, True),            # scale-up
    (decision(2), 3, 0, 0.0, True),             # scale-down
    (decision(3, recommended=1), 3, 0, 0.0, True),   # a scale-down the window holds back
    (decision(3), 3, 0, None, False),           # steady and idle: never read
    (decision(3), 3, 12, None, True),           # steady with a backlog, never read
    (decision(3), 3, 12, 100.0 - STEADY_READING_SECONDS + 1, False),  # ... read lately
    (decision(3), 3, 12, 100.0 - STEADY_READING_SECONDS, True),       # ... due again
])
def test_when_the_workers_are_read(made, current, depth, last, due):
    assert reading_due(made, current, depth, last, now=100.0) is due
