"""One poll end to end against in-memory fakes (the pure parts are tested on their own; the real
API server and brokers in test_operator_cluster.py and test_operator_services.py)."""
from __future__ import annotations

import asyncio

from fakes import Clock, FakeBroker, FakeKube, PolledPool, make_deps, pool_body, running_pod
from taskherd.operator.deletion_cost import ANNOTATION, removed_by_replicaset
from taskherd.operator.broker import ObservationError
from taskherd.operator.scaling import Observation
from taskherd.operator.scheduler import PoolScheduler


def condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def ready(status):
    """What the Ready and Status columns of `kubectl get wp` show."""
    return condition(status, "Ready")["status"], condition(status, "Ready")["reason"]


def test_work_on_an_idle_pool_scales_from_zero_on_the_first_poll():
    kube = FakeKube(replicas={"workers": 0})
    deps = make_deps(kube, FakeBroker(Observation(ready=23, unacked=0, oldest_message_age_seconds=4.2)))
    status = PolledPool(deps).poll()
    assert kube.scale_calls == [5]
    assert status["desiredReplicas"] == 5 and status["observedDepth"] == 23
    assert status["oldestMessageAgeSeconds"] == 4 and ready(status) == ("True", "ScalingUp")
    assert status["lastScaleReason"].startswith("0 -> 5: depth 23")
    assert condition(status, "Ready")["status"] == "True"


def test_an_unreachable_broker_is_a_condition_with_the_error_and_replicas_hold():
    kube = FakeKube(replicas={"workers": 3})
    error = ObservationError("BrokerUnreachable: redis://:s3cret@redis:6379/0 refused")
    deps = make_deps(kube, FakeBroker(error=error))
    pool = PolledPool(deps)
    for _ in range(3):
        status = pool.poll()
        deps.clock.t += 5
    assert kube.scale_calls == []
    cond = condition(status, "BrokerReachable")
    assert cond["status"] == "False" and "refused" in cond["message"] and "s3cret" not in cond["message"]
    assert ready(status) == ("False", "BrokerUnreachable") and status["desiredReplicas"] == 3


def test_a_missing_deployment_is_reported():
    deps = make_deps(FakeKube(), FakeBroker(Observation(ready=1, unacked=0)))
    status = PolledPool(deps).poll()
    assert ready(status) == ("False", "ScaleTargetNotFound")
    assert condition(status, "ScaleTargetFound")["message"] == "Deployment ns/workers not found"


def test_an_invalid_spec_is_reported_not_raised():
    deps = make_deps(FakeKube(replicas={"workers": 1}), FakeBroker(Observation(ready=1, unacked=0)))
    status = PolledPool(deps, pool_body(minReplicas=20)).poll()
    assert ready(status) == ("False", "InvalidSpec")
    assert "spec.minReplicas=20" in condition(status, "Ready")["message"]


def test_scale_down_waits_for_the_window_then_marks_idle_pods_cheapest():
    pods = [running_pod(f"w{i}") for i in range(4)]
    kube = FakeKube(replicas={"workers": 4}, pods=pods)
    broker = FakeBroker(Observation(ready=0, unacked=2))
    clock = Clock()
    deps = make_deps(kube, broker, busy={"w0": 0, "w1": 1, "w2": 0, "w3": 1}, clock=clock)
    pool = PolledPool(deps)
    for _ in range(12):  # 55 s < the 60 s window
        pool.poll()
        clock.t += 5
    assert kube.scale_calls == [] and kube.annotations == {}
    pool.poll()  # now the history covers the window
    assert kube.scale_calls == [2], "down to the 2 busy workers, not below"
    assert kube.annotations == {"w0": "0", "w1": "1", "w2": "0", "w3": "1"}
    assert sorted(removed_by_replicaset({p["metadata"]["name"]: int(p["metadata"]["annotations"][ANNOTATION])
                                         for p in pods}, 2)) == ["w0", "w2"]
    assert pool.body["status"]["busyWorkers"] == 2 and ready(pool.body["status"]) == ("True", "ScalingDown")


def test_dead_letters_page_once_resend_and_resolve():
    posts = []
    kube = FakeKube(replicas={"workers": 1})
    broker = FakeBroker(Observation(ready=0, unacked=0, dead_letters={"celery.dlq": 3}))
    clock = Clock()
    deps = make_deps(kube, broker, posts=posts, clock=clock)
    pool = PolledPool(deps, pool_body(minReplicas=1, deadLetter={"threshold": 2, "alertmanagerUrl": "http://am:9093"}))
    status = pool.poll()
    assert [e[:2] for e in kube.posted_events] == [("Warning", "DeadLetterThreshold")]
    assert len(posts) == 1 and posts[0][0] == "http://am:9093/api/v2/alerts"
    assert posts[0][1][0]["labels"]["queue"] == "celery.dlq"
    assert condition(status, "DeadLetterAlert")["status"] == "True" and ready(status) == ("True", "DeadLetterAlert")
    for _ in range(11):  # 55 s: no re-send, no new event
        clock.t += 5
        pool.poll()
    assert len(posts) == 1 and len(kube.posted_events) == 1
    clock.t += 5
    pool.poll()
    assert len(posts) == 2, "re-sent after the 60 s resend interval"
    broker.observation = Observation(ready=0, unacked=0, dead_letters={"celery.dlq": 1})
    clock.t += 5
    status = pool.poll()
    assert len(posts) == 3 and posts[2][1][0]["endsAt"] < posts[1][1][0]["endsAt"]
    assert [e[:2] for e in kube.posted_events][-1] == ("Normal", "DeadLetterResolved")
    assert condition(status, "DeadLetterAlert")["status"] == "False"
    assert status["deadLetterAlert"] == {"celery.dlq": None}


def test_a_restarted_operator_does_not_page_twice():
    posts = []
    kube = FakeKube(replicas={"workers": 1})
    broker = FakeBroker(Observation(ready=0, unacked=0, dead_letters={"celery.dlq": 3}))
    deps = make_deps(kube, broker, posts=posts)
    body = pool_body(minReplicas=1, deadLetter={"alertmanagerUrl": "http://am:9093"})
    PolledPool(deps, body).poll()
    deps.clock.t += 5
    PolledPool(deps, body).poll()  # fresh memory: the state comes from the status
    assert len(posts) == 1 and len(kube.posted_events) == 1


def test_an_undeliverable_page_is_a_condition_and_is_retried():
    kube = FakeKube(replicas={"workers": 1})
    broker = FakeBroker(Observation(ready=0, unacked=0, dead_letters={"celery.dlq": 3}))
    deps = make_deps(kube, broker, fail_posts=True)
    pool = PolledPool(deps, pool_body(minReplicas=1, deadLetter={"webhookUrl": "http://hook"}))
    status = pool.poll()
    assert condition(status, "DeadLetterAlert")["reason"] == "PageNotDelivered"
    assert "alertmanager down" in condition(status, "DeadLetterAlert")["message"]
    assert pool.memory.paging.firing["celery.dlq"].last_sent is None


def test_a_steady_pool_writes_its_status_once():
    kube = FakeKube(replicas={"workers": 1})
    deps = make_deps(kube, FakeBroker(Observation(ready=2, unacked=1)))
    pool = PolledPool(deps, pool_body(minReplicas=1))
    for _ in range(5):
        pool.poll()
        deps.clock.t += 5
    assert len(kube.statuses) == 1


def test_terminations_appear_in_the_status():
    pod = running_pod("w0")
    pod["status"]["containerStatuses"][0].update(
        restartCount=2, lastState={"terminated": {"reason": "OOMKilled", "exitCode": 137,
                                                  "finishedAt": "2026-11-29T10:00:00Z"}})
    kube = FakeKube(replicas={"workers": 1}, pods=[pod])
    deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)))
    status = PolledPool(deps, pool_body(minReplicas=1)).poll()
    assert status["recentTerminations"][0] == {"pod": "w0", "container": "worker", "reason": "OOMKilled",
                                               "exitCode": 137, "finishedAt": "2026-11-29T10:00:00Z",
                                               "restartCount": 2}


def test_scheduler_polls_each_pool_at_its_interval_and_only_while_leading():
    async def scenario():
        kube = FakeKube(replicas={"workers": 1})
        deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)))
        seen = []
        original = deps.observe

        async def counting(namespace, broker):
            seen.append(t[0])
            return await original(namespace, broker)

        deps.observe = counting
        t, leading = [0.0], [False]
        scheduler = PoolScheduler(deps=deps, is_leading=lambda: leading[0], monotonic=lambda: t[0])
        scheduler.upsert(pool_body(minReplicas=1, pollIntervalSeconds=2))
        for step in range(20):
            t[0] = step * 0.5
            leading[0] = step >= 4
            await asyncio.gather(*scheduler.start_due())
        scheduler.remove("ns", "pool")
        assert scheduler.start_due() == []
        return seen

    assert asyncio.run(scenario()) == [2.0, 4.0, 6.0, 8.0]


def test_an_api_error_reading_the_scale_is_a_condition():
    class Forbidden(FakeKube):
        async def get_scale(self, namespace, deployment):
            raise PermissionError("403 deployments/scale is forbidden")

    deps = make_deps(Forbidden(), FakeBroker(Observation(ready=1, unacked=0)))
    status = PolledPool(deps).poll()
    cond = condition(status, "ScaleTargetFound")
    assert cond["status"] == "False" and "forbidden" in cond["message"]
    assert ready(status) == ("False", "FailedGetScale")


def test_a_dry_run_reads_decides_and_logs_every_write_without_making_it(caplog):
    from taskherd.operator.kube import DryRunKube

    pods = [running_pod(f"w{i}") for i in range(3)]
    kube = FakeKube(replicas={"workers": 3}, pods=pods)
    deps = make_deps(DryRunKube(kube), FakeBroker(Observation(ready=40, unacked=0,
                                                              dead_letters={"celery.dlq": 2})))
    pool = PolledPool(deps, pool_body(deadLetter={"alertmanagerUrl": "http://am:9093"}))
    with caplog.at_level("INFO", logger="taskherd.operator"):
        status = pool.poll()
    assert (kube.scale_calls, kube.statuses, kube.posted_events) == ([], [], [])
    assert status["desiredReplicas"] == 8
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("**DRY-RUN**")]
    assert "**DRY-RUN**: would scale Deployment ns/workers to 8 replicas" in lines
    assert any(line.startswith("**DRY-RUN**: would post Warning Event DeadLetterThreshold") for line in lines)
    assert "**DRY-RUN**: would patch the status of WorkerPool ns/pool" in lines


def test_worker_pods_that_cannot_be_listed_block_a_scale_down():
    class PodsForbidden(FakeKube):
        async def list_pods(self, namespace, selector):
            raise PermissionError("403 pods is forbidden")

    kube = PodsForbidden(replicas={"workers": 4})
    deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)))
    pool = PolledPool(deps, pool_body(scaleDownStabilizationSeconds=0))
    status = pool.poll()
    assert kube.scale_calls == [] and status["desiredReplicas"] == 4
    assert "4 workers are busy" in status["lastDecisionReason"]
    assert pool.last.errors == ["busyness"]


def test_a_failing_condition_posts_one_warning_event_not_one_per_poll():
    kube = FakeKube(replicas={})
    deps = make_deps(kube, FakeBroker(Observation(ready=1, unacked=0)))
    pool = PolledPool(deps)
    for _ in range(4):
        pool.poll()
        deps.clock.t += 5
    assert [e[:2] for e in kube.posted_events] == [("Warning", "ScaleTargetNotFound")]


def test_the_scheduler_logs_one_summary_line_per_round(caplog):
    async def scenario():
        kube = FakeKube(replicas={"workers": 0, "other": 1})
        deps = make_deps(kube, FakeBroker(Observation(ready=12, unacked=0)))
        scheduler = PoolScheduler(deps=deps, monotonic=lambda: 0.0)
        scheduler.upsert(pool_body())
        second = pool_body(scaleTargetRef={"name": "missing"})
        second["metadata"]["name"] = "broken"
        scheduler.upsert(second)
        await asyncio.gather(*scheduler.start_due())

    with caplog.at_level("INFO", logger="taskherd.operator"):
        asyncio.run(scenario())
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("poll completed")]
    assert summaries == ["poll completed: pools=2 scaled=1 paged=0 errors=1"]


def test_the_status_says_when_the_oldest_age_is_only_a_lower_bound():
    kube = FakeKube(replicas={"workers": 2})
    deps = make_deps(kube, FakeBroker(Observation(ready=4, unacked=0, oldest_message_age_seconds=7.6,
                                                  oldest_message_age_is_lower_bound=True)))
    status = PolledPool(deps, pool_body(maxOldestMessageAgeSeconds=30, scaleDownStabilizationSeconds=0)).poll()
    assert (status["oldestMessageAgeSeconds"], status["oldestMessageAge"]) == (7, ">=7s")
    assert kube.scale_calls == [] and "at least 7s, perhaps more" in status["lastDecisionReason"]


def test_dead_letter_queues_not_reported_yet_neither_fire_nor_resolve_a_page():
    kube = FakeKube(replicas={"workers": 1})
    broker = FakeBroker(Observation(ready=0, unacked=0, dead_letters={"celery.dlq": 3}))
    deps = make_deps(kube, broker)
    pool = PolledPool(deps, pool_body(minReplicas=1))
    pool.poll()
    broker.observation = Observation(ready=0, unacked=0, dead_letters={"celery.dlq": None},
                                     pending_queues=("celery",))
    deps.clock.t += 5
    status = pool.poll()
    assert [e[1] for e in kube.posted_events] == ["DeadLetterThreshold"]
    assert condition(status, "DeadLetterAlert")["status"] == "True"


def test_every_rescale_posts_the_hpas_successful_rescale_event():
    kube = FakeKube(replicas={"workers": 0})
    deps = make_deps(kube, FakeBroker(Observation(ready=23, unacked=0)))
    PolledPool(deps).poll()
    assert kube.posted_events == [("Normal", "SuccessfulRescale",
                                   "New size: 5; reason: depth 23 (ready 23, unacked 0) needs 5 at 5 per worker")]


def test_a_failed_rescale_is_a_condition_and_one_warning_event():
    class ScaleForbidden(FakeKube):
        async def set_scale(self, namespace, target, replicas):
            raise PermissionError("403 deployments/scale is forbidden")

    kube = ScaleForbidden(replicas={"workers": 0})
    deps = make_deps(kube, FakeBroker(Observation(ready=23, unacked=0)))
    pool = PolledPool(deps)
    for _ in range(3):
        status = pool.poll()
        deps.clock.t += 5
    assert ready(status) == ("False", "FailedRescale") and "forbidden" in condition(status, "ScalingActive")["message"]
    assert [e[1] for e in kube.posted_events] == ["FailedRescale"]
    assert status["lastScaleTime"] is None


def paused(**annotations):
    body = pool_body(scaleDownStabilizationSeconds=0)
    body["metadata"]["annotations"] = annotations
    return body


def test_paused_replicas_hold_the_target_at_n_whatever_the_queues_say():
    pods = [running_pod(f"w{i}") for i in range(4)]
    kube = FakeKube(replicas={"workers": 4}, pods=pods)
    broker = FakeBroker(Observation(ready=200, unacked=0))
    deps = make_deps(kube, broker, busy={"w0": 1, "w1": 0, "w2": 1, "w3": 0})
    pool = PolledPool(deps, paused(**{"taskherd.io/paused-replicas": "2"}))
    status = pool.poll()
    assert kube.scale_calls == [2], "to exactly N, though 200 messages wait"
    assert kube.annotations == {"w0": "1", "w1": "0", "w2": "1", "w3": "0"}, "idle pods go first"
    assert ready(status) == ("True", "Paused")
    assert condition(status, "ScalingActive")["reason"] == "Paused"
    assert ("Normal", "Paused") in [e[:2] for e in kube.posted_events]
    deps.clock.t += 5
    pool.poll()
    assert kube.scale_calls == [2], "held there"
    del pool.body["metadata"]["annotations"]
    deps.clock.t += 5
    status = pool.poll()
    assert kube.scale_calls == [2, 10] and ready(status) == ("True", "ScalingUp")
    assert [e[1] for e in kube.posted_events][-2:] == ["Resumed", "SuccessfulRescale"]


def test_paused_holds_the_current_replicas_and_a_bad_value_pauses_too():
    kube = FakeKube(replicas={"workers": 3})
    deps = make_deps(kube, FakeBroker(Observation(ready=0, unacked=0)))
    status = PolledPool(deps, paused(**{"taskherd.io/paused": "true"})).poll()
    assert kube.scale_calls == [] and status["desiredReplicas"] == 3 and ready(status) == ("True", "Paused")
    status = PolledPool(deps, paused(**{"taskherd.io/paused-replicas": "two"})).poll()
    assert kube.scale_calls == [] and ready(status) == ("True", "Paused")
    cond = condition(status, "ScalingActive")
    assert cond["reason"] == "InvalidPauseAnnotation"
    assert "taskherd.io/paused-replicas='two' is invalid: must be a whole number of replicas 0-1000" in cond["message"]


def test_conditions_carry_the_generation_they_were_set_for():
    deps = make_deps(FakeKube(replicas={"workers": 1}), FakeBroker(Observation(ready=0, unacked=0)))
    body = pool_body(minReplicas=1)
    body["metadata"]["generation"] = 7
    status = PolledPool(deps, body).poll()
    assert status["observedGeneration"] == 7
    assert {c["observedGeneration"] for c in status["conditions"]} == {7}


def test_a_new_pause_annotation_is_acted_on_at_once_not_at_the_next_interval():
    async def scenario():
        kube = FakeKube(replicas={"workers": 3})
        deps = make_deps(kube, FakeBroker(Observation(ready=30, unacked=0)))
        t = [0.0]
        scheduler = PoolScheduler(deps=deps, monotonic=lambda: t[0])
        body = pool_body(pollIntervalSeconds=60)
        scheduler.upsert(body)
        await asyncio.gather(*scheduler.start_due())
        t[0] = 1.0
        body = {**body, "metadata": {**body["metadata"], "annotations": {"taskherd.io/paused-replicas": "1"}}}
        scheduler.upsert(body)
        await asyncio.gather(*scheduler.start_due())
        return kube.scale_calls

    assert asyncio.run(scenario()) == [6, 1]


def _drained_pool(slots):
    """Eight workers drain a 40-message backlog for 100 s, each finishing a one-second task every
    ten seconds (0.8 tasks/s for the pool: Little's law needs 1 worker of 2 slots), then the queue
    is empty. Returns the replicas, by time, after each poll once it is empty, and the status
    the first of those polls wrote."""
    from taskherd.operator.busyness import PodReading

    pods = [running_pod(f"w{i}") for i in range(8)]
    kube = FakeKube(replicas={"workers": 8}, pods=pods)
    broker = FakeBroker(Observation(ready=30, unacked=10, oldest_message_age_seconds=2.0))
    clock = Clock()
    started = clock.t
    deps = make_deps(kube, broker, clock=clock)
    reads = []

    async def reader(pod):
        reads.append(clock.t)
        done = (clock.t - started) / 10
        return PodReading(in_flight=0, completed=done, busy_seconds=done * 1.0, slots=slots)

    deps.busyness = reader
    pool = PolledPool(deps)
    for _ in range(20):  # 100 s of backlog: steady at 8, read every 30 s (t = 0, 30, 60, 90)
        pool.poll()
        clock.t += 5
    assert kube.scale_calls == []
    assert len(reads) == 4 * 8, "a steady pool with a backlog is read every 30 s, not every poll"
    broker.observation = Observation(ready=0, unacked=0)
    calls, statuses = [], []
    for _ in range(14):
        statuses.append(pool.poll())
        calls.append((clock.t - started, kube.replicas["workers"]))
        clock.t += 5
    return calls, statuses[0]


def test_workers_added_for_a_backlog_go_once_it_is_drained_when_the_arrivals_need_fewer():
    """Little's law from the workers' own counters: the window holds what the arrivals need."""
    calls, status = _drained_pool(slots=2)
    # The throughput is known from the second reading (t = 30); what the window holds since then
    # is the 1 worker the arrivals need, and what it held before left it at t = 25 + 60.
    assert calls[0] == (100.0, 1), calls
    assert "holds only the 1 worker(s) the arrivals need (Little's law)" in status["lastScaleReason"]


def test_without_the_workers_slots_the_window_holds_every_worker_as_the_hpa_does():
    calls, _ = _drained_pool(slots=None)
    assert calls[0][1] == 8 and calls[-1][1] == 0, calls
    assert min(t for t, replicas in calls if replicas < 8) >= 95 + 60, "held for the whole window"
