"""Idle workers first: the pod-deletion-cost annotations (taskherd.operator.deletion_cost, busyness)."""
from __future__ import annotations

import asyncio

from hypothesis import given, settings, strategies as st

from taskherd.operator.busyness import PodReading, parse_reading, read_busyness
from taskherd.operator.deletion_cost import (PodBusyness, annotations_to_change, busy_count, deletion_costs,
                                             removed_by_replicaset)

pods = st.lists(
    st.builds(PodBusyness, name=st.uuids().map(str), in_flight=st.one_of(st.none(), st.integers(0, 50)),
              running=st.booleans()),
    max_size=30, unique_by=lambda p: p.name)


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(pods, st.data())
def test_a_busy_pod_is_never_removed_while_an_idle_one_remains(pool, data):
    costs = deletion_costs(pool)
    remove = data.draw(st.integers(0, len(pool)))
    removed = set(removed_by_replicaset(costs, remove))
    busy = {p.name for p in pool if p.busy}
    idle = {p.name for p in pool} - busy
    if removed & busy:
        assert idle <= removed, "a busy pod was chosen while an idle one was left"


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(pods)
def test_every_idle_pod_costs_less_than_every_busy_pod(pool):
    costs = deletion_costs(pool)
    idle = [costs[p.name] for p in pool if not p.busy]
    busy = [costs[p.name] for p in pool if p.busy]
    if idle and busy:
        assert max(idle) < min(busy)


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(pods)
def test_busier_pods_cost_more_and_unreadable_pods_cost_most(pool):
    costs = deletion_costs(pool)
    for a in pool:
        for b in pool:
            if a.running and b.running and a.in_flight is not None:
                if b.in_flight is None or b.in_flight > a.in_flight:
                    assert costs[b.name] >= costs[a.name]


@settings(deadline=None)  # a shared 2-core machine: no per-example deadline
@given(pods)
def test_a_steady_pool_needs_no_annotation_writes(pool):
    costs = deletion_costs(pool)
    assert annotations_to_change(costs, {k: str(v) for k, v in costs.items()}) == {}
    assert annotations_to_change(costs, {}) == costs


def test_busy_count_treats_unreadable_running_pods_as_busy():
    assert busy_count([PodBusyness("a", 0), PodBusyness("b", 2), PodBusyness("c", None),
                       PodBusyness("d", None, running=False)]) == 2


METRICS = """# HELP taskherd_tasks_in_flight Tasks being executed right now
# TYPE taskherd_tasks_in_flight gauge
taskherd_tasks_in_flight{queue="a"} 2.0
taskherd_tasks_in_flight{queue="b"} 1.0
# HELP taskherd_tasks_in_flight_total_bogus other
# TYPE taskherd_tasks_in_flight_total_bogus counter
taskherd_tasks_in_flight_total_bogus 9.0
"""


def test_in_flight_gauge_is_summed_over_label_sets():
    assert parse_reading(METRICS).in_flight == 3
    assert parse_reading("taskherd_tasks_in_flight 0\n").in_flight == 0
    assert parse_reading("other_metric 1\n") is None
    assert parse_reading("not { the format") is None
    assert parse_reading("taskherd_tasks_in_flight{task=\"a\"} NaNish\n") is None


def test_label_values_may_hold_spaces_braces_quotes_and_a_timestamp_may_follow():
    text = ('taskherd_tasks_in_flight{task="send mail {v2} \\"now\\""} 2.0 1712000000000\n'
            'taskherd_tasks_in_flight_total_bogus 9.0\n'
            'taskherd_tasks_in_flight 1\n')
    assert parse_reading(text).in_flight == 3


def test_a_reading_parses_only_its_own_lines():
    """A few hundred lines of other metrics cost nothing, even ones the parser would refuse."""
    text = "other_metric{a=\"b\"} 1\n" * 500 + "not { the format\n" + "taskherd_tasks_in_flight 2\n"
    assert parse_reading(text).in_flight == 2


def test_a_reading_carries_the_workers_throughput_counters():
    """The runtime histogram's count and sum over every task name, and the worker's slots."""
    text = METRICS + """# TYPE taskherd_task_runtime_seconds histogram
taskherd_task_runtime_seconds_bucket{le="1.0",task="a"} 3.0
taskherd_task_runtime_seconds_bucket{le="+Inf",task="a"} 4.0
taskherd_task_runtime_seconds_count{task="a"} 4.0
taskherd_task_runtime_seconds_sum{task="a"} 6.5
taskherd_task_runtime_seconds_bucket{le="+Inf",task="b"} 1.0
taskherd_task_runtime_seconds_count{task="b"} 1.0
taskherd_task_runtime_seconds_sum{task="b"} 0.5
# TYPE taskherd_worker_slots gauge
taskherd_worker_slots 4.0
"""
    assert parse_reading(text) == PodReading(in_flight=3, completed=5.0, busy_seconds=7.0, slots=4)
    # A worker of an older version exports no slots: no throughput from it, in-flight as before.
    assert parse_reading(METRICS).slots is None


def test_read_busyness_reads_only_running_pods():
    calls = []

    async def reader(pod):
        calls.append(pod["metadata"]["name"])
        return PodReading(in_flight=4)

    listed = [
        {"metadata": {"name": "run"}, "status": {"phase": "Running", "podIP": "10.0.0.1"}},
        {"metadata": {"name": "pending"}, "status": {"phase": "Pending"}},
        {"metadata": {"name": "leaving", "deletionTimestamp": "2026-01-01T00:00:00Z"},
         "status": {"phase": "Running", "podIP": "10.0.0.2"}},
    ]
    result = asyncio.run(read_busyness(listed, reader))
    assert calls == ["run"]
    assert {p.name: (p.in_flight, p.running) for p in result} == {
        "run": (4, True), "pending": (0, False), "leaving": (0, False)}


def test_read_busyness_keeps_a_readings_counters():
    async def reader(pod):
        return PodReading(in_flight=1, completed=10.0, busy_seconds=12.5, slots=2)

    pod = {"metadata": {"name": "run"}, "status": {"phase": "Running", "podIP": "10.0.0.1"}}
    [read] = asyncio.run(read_busyness([pod], reader))
    assert read == PodBusyness("run", 1, completed=10.0, busy_seconds=12.5, slots=2)


def test_a_reading_agrees_with_prometheus_clients_own_parser_on_a_workers_text():
    """What the worker really serves (its metric objects, awkward task names included)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from taskherd.worker.components.metrics import TaskMetrics

    registry = CollectorRegistry()
    metrics = TaskMetrics(registry=registry)
    for i, task in enumerate(["a", 'quote " and \\ backslash', "brace } space", "x" * 200]):
        metrics.tasks.labels(task, "succeeded").inc(i + 1)
        metrics.runtime.labels(task).observe(0.25 * (i + 1))
        metrics.in_flight.labels(task).set(i)
    text = generate_latest(registry).decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    assert parse_reading(text) == PodReading(
        in_flight=int(sums["taskherd_tasks_in_flight"]), completed=sums["taskherd_task_runtime_seconds_count"],
        busy_seconds=sums["taskherd_task_runtime_seconds_sum"], slots=None)


def test_the_reader_gets_a_workers_metrics_over_http_and_none_from_anything_else():
    """Against the worker's own HTTP server (taskherd.worker.components.probes.serve) on loopback."""
    import socket
    import time

    from e2e.lib.services import free_port
    from taskherd.operator.busyness import MetricsBusynessReader, WorkerMetrics
    from taskherd.operator.child_deaths import MetricsChildDeathReader
    from taskherd.worker.components.probes import serve

    text = "taskherd_tasks_in_flight 2\ntaskherd_worker_slots 4\n" + "# padding\n" * 20000
    requests, queries = [], []

    def app(environ, start_response):  # a worker that ignores ?name[]= and serves no build info
        requests.append(environ["PATH_INFO"])
        queries.append(environ.get("QUERY_STRING", ""))
        start_response("200 OK", [("Content-Type", "text/plain; version=0.0.4")])
        return [text.encode()]

    port = free_port()
    server = serve(app, port=port, address="127.0.0.1")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts, never answers
    pod = {"metadata": {"name": "w"}, "status": {"phase": "Running", "podIP": "127.0.0.1"}}
    try:
        assert asyncio.run(MetricsBusynessReader(port=port)(pod)) == PodReading(in_flight=2, slots=4)
        # One poll's busyness and pool-child deaths share one request per pod; the next poll asks again.
        clock = [100.0]
        metrics = WorkerMetrics(port=port, clock=lambda: clock[0])
        requests.clear()
        assert asyncio.run(MetricsBusynessReader(metrics)(pod)).in_flight == 2
        assert asyncio.run(MetricsChildDeathReader(metrics)(pod)) == []
        assert requests == ["/metrics"]
        clock[0] += 5
        asyncio.run(MetricsBusynessReader(metrics)(pod))
        assert requests == ["/metrics", "/metrics"]
        # Asking for a few series: a worker that answers without its build info (this app ignores
        # the filter and has none, as an older worker's empty answer) is asked again for everything.
        requests.clear()
        queries.clear()
        filtered = WorkerMetrics(port=port, names=["taskherd_tasks_in_flight"])
        assert asyncio.run(MetricsBusynessReader(filtered)(pod)).in_flight == 2
        assert requests == ["/metrics", "/metrics"]
        assert queries[0] == "name%5B%5D=taskherd_tasks_in_flight&name%5B%5D=taskherd_build_info"
        assert asyncio.run(MetricsBusynessReader(port=free_port())(pod)) is None, "nothing listens"
        started = time.monotonic()
        assert asyncio.run(MetricsBusynessReader(port=silent.getsockname()[1], timeout=0.5)(pod)) is None
        assert time.monotonic() - started < 2
    finally:
        server.shutdown()
        silent.close()
