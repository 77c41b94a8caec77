"""Pool processes killed inside a live container (the OOM killer on cgroup v1 and v2 takes the child,
not the container): the operator reads them from the workers' metrics into the WorkerPool status,
once each, with a Warning Event."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from fakes import Clock, FakeBroker, FakeKube, PolledPool, make_deps, pool_body, running_pod
from taskherd.operator.child_deaths import ChildDeaths, parse_child_deaths
from taskherd.operator.plan import TERMINATIONS_EVERY_SECONDS
from taskherd.operator.scaling import Observation
from taskherd.worker.components.metrics import TaskMetrics

T0 = 1_800_000_000.0


def test_the_operator_parses_what_the_worker_exports():
    registry = CollectorRegistry()
    metrics = TaskMetrics(registry=registry)
    metrics.child_deaths.labels("reports.build", "OOMKilled").inc(2)
    metrics.last_child_death.labels("reports.build", "OOMKilled").set(T0)
    metrics.child_deaths.labels("charges.capture", "SIGKILL").inc()
    metrics.last_child_death.labels("charges.capture", "SIGKILL").set(T0 + 5)
    metrics.in_flight.labels("charges.capture").inc()
    assert parse_child_deaths(generate_latest(registry).decode()) == [
        ChildDeaths("reports.build", "OOMKilled", 2, T0), ChildDeaths("charges.capture", "SIGKILL", 1, T0 + 5)]
    assert parse_child_deaths("# TYPE x counter\nx 1\n") == []
    assert parse_child_deaths("not {prometheus") == [], "only the deaths' own lines are parsed"
    assert parse_child_deaths('taskherd_pool_child_deaths_total{task="a" 1\n') is None


def oom(count: int, at: float) -> list[ChildDeaths]:
    return [ChildDeaths("reports.build", "OOMKilled", count, at)]


def test_each_child_death_is_listed_and_announced_once():
    readings = {"w0": oom(1, T0 - 10)}
    kube = FakeKube(replicas={"workers": 1}, pods=[running_pod("w0"), running_pod("w1")])
    deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)), child_deaths=readings, clock=Clock(T0))
    pool = PolledPool(deps, pool_body(minReplicas=1))

    status = pool.poll()
    assert status["recentTerminations"] == [{"pod": "w0", "process": "pool-child", "reason": "OOMKilled",
                                             "task": "reports.build", "count": 1,
                                             "finishedAt": "2027-01-15T07:59:50Z"}]
    warnings = [e for e in kube.posted_events if e[1].startswith("PoolChild")]
    assert warnings == [("Warning", "PoolChildOOMKilled",
                         "pod w0: the pool process running reports.build was OOM-killed (its container's memory "
                         "limit); 1 such death(s) in this pod; the task went back to its queue")]

    deps.clock.t += TERMINATIONS_EVERY_SECONDS
    pool.poll()  # the same figures: nothing new
    assert len([e for e in kube.posted_events if e[1].startswith("PoolChild")]) == 1

    readings["w0"] = oom(2, T0 + 20)
    readings["w1"] = [ChildDeaths("charges.capture", "SIGKILL", 1, T0 + 25)]
    deps.clock.t += TERMINATIONS_EVERY_SECONDS
    status = pool.poll()
    assert [(t["pod"], t["reason"], t["count"]) for t in status["recentTerminations"]] == [
        ("w1", "SIGKILL", 1), ("w0", "OOMKilled", 2), ("w0", "OOMKilled", 1)]
    assert [e[1] for e in kube.posted_events if e[1].startswith("PoolChild")] == [
        "PoolChildOOMKilled", "PoolChildOOMKilled", "PoolChildDied"]

    # A new operator (leader change, restart) starts from the status: nothing is announced twice.
    again = PolledPool(make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)), child_deaths=readings,
                                 clock=Clock(deps.clock.t + 60)), pool.body)
    again.poll()
    assert len([e for e in kube.posted_events if e[1].startswith("PoolChild")]) == 3


def test_a_deleted_pods_child_deaths_stay_listed():
    readings = {"w0": oom(3, T0 - 5)}
    kube = FakeKube(replicas={"workers": 1}, pods=[running_pod("w0")])
    deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)), child_deaths=readings, clock=Clock(T0))
    pool = PolledPool(deps, pool_body(minReplicas=1))
    pool.poll()
    readings.clear()
    kube.pods = [running_pod("w2")]
    deps.clock.t += TERMINATIONS_EVERY_SECONDS
    status = pool.poll()
    assert [(t["pod"], t["count"]) for t in status["recentTerminations"]] == [("w0", 3)]


class CountingKube(FakeKube):
    event_lists = 0

    async def list_pod_events(self, namespace):
        self.event_lists += 1
        return await super().list_pod_events(namespace)


def test_a_pod_the_scale_down_removes_has_its_deaths_listed_first():
    # An idle pod whose pool processes were just killed is the one a scale-down removes first
    # (lowest deletion cost); if its deaths waited for the next 30 s report they would go with it.
    # The busyness reading before the scale-down reads them (the same /metrics text).
    readings: dict[str, list] = {}
    broker = FakeBroker(Observation(ready=15, unacked=0))
    kube = CountingKube(replicas={"workers": 3}, pods=[running_pod("w0"), running_pod("w1"), running_pod("w2")])
    deps = make_deps(kube, broker, child_deaths=readings, clock=Clock(T0))
    pool = PolledPool(deps, pool_body(minReplicas=0, scaleDownStabilizationSeconds=0))
    status = pool.poll()  # 3 workers for 15 messages; the first report (nothing died)
    assert status["recentTerminations"] == [] and kube.event_lists == 1

    readings["w0"] = [ChildDeaths("mailer.send", "SIGKILL", 2, T0 + 3)]
    broker.observation = Observation(ready=0, unacked=0)
    deps.clock.t += 5  # long before the next report is due
    status = pool.poll()
    assert kube.scale_calls == [0], "the queue is empty: the pool scales down"
    assert [(t["pod"], t["process"], t["reason"], t["count"]) for t in status["recentTerminations"]] == [
        ("w0", "pool-child", "SIGKILL", 2)]
    assert [e[1] for e in kube.posted_events if e[1].startswith("PoolChild")] == ["PoolChildDied"]
    assert kube.event_lists == 1, "the pods' Events are still listed every 30 s only"

    kube.pods = []
    readings.clear()
    deps.clock.t += TERMINATIONS_EVERY_SECONDS
    status = pool.poll()  # the full report, the pod gone: its deaths stay listed, announced once
    assert [(t["pod"], t["count"]) for t in status["recentTerminations"]] == [("w0", 2)]
    assert len([e for e in kube.posted_events if e[1].startswith("PoolChild")]) == 1
