"""Spec parsing (policy), termination reports and leader election rules: pure parts of the operator."""
from __future__ import annotations

import pytest

from taskherd.operator.leader import Observed, may_acquire
from taskherd.operator.policy import InvalidSpec, parse_spec, parse_spec_cached
from taskherd.operator.status import Conditions
from taskherd.operator.terminations import recent_terminations

GOOD = {"scaleTargetRef": {"name": "workers"}, "broker": {"type": "redis", "secretRef": {"name": "b"},
                                                          "queues": ["celery", "mail"]},
        "maxReplicas": 4}


def test_defaults_and_dead_letter_queue_names():
    spec = parse_spec(GOOD)
    assert spec.broker.dead_letter_queues == ("celery.dlq", "mail.dlq")
    assert spec.poll_interval_seconds == 5 and spec.scaling.min_replicas == 0
    assert spec.scaling.scale_down_stabilization_seconds == 300
    assert spec.dead_letter.threshold == 1 and spec.dead_letter.resend_interval_seconds == 60


@pytest.mark.parametrize("change,message", [
    ({"minReplicas": 5}, "spec.minReplicas=5 is invalid: must be <= spec.maxReplicas (4)"),
    ({"maxReplicas": 0}, "spec.maxReplicas=0 is invalid: must be a whole number from 1 to 1000"),
    ({"maxReplicas": "10"}, "spec.maxReplicas='10' is invalid: must be a whole number from 1 to 1000"),
    ({"targetDepthPerWorker": 0}, "spec.targetDepthPerWorker=0 is invalid: must be a whole number from 1 to 100000"),
    ({"maxOldestMessageAgeSeconds": 0},
     "spec.maxOldestMessageAgeSeconds=0 is invalid: must be a whole number from 1 to 86400"),
    ({"broker": {"type": "kafka", "secretRef": {"name": "b"}, "queues": ["q"]}}, "spec.broker.type='kafka'"),
    ({"broker": {"type": "redis", "secretRef": {"name": "b"}, "queues": []}}, "spec.broker.queues=[]"),
    ({"scaleTargetRef": {"kind": "deployment", "name": "x"}}, "spec.scaleTargetRef.kind='deployment'"),
])
def test_invalid_specs_name_the_key_the_value_and_the_range(change, message):
    with pytest.raises(InvalidSpec) as info:
        parse_spec({**GOOD, **change})
    assert message in str(info.value)


def test_a_cached_parse_follows_every_edit_of_the_spec():
    assert parse_spec_cached(GOOD) == parse_spec(GOOD)
    assert parse_spec_cached({**GOOD, "maxReplicas": 9}).scaling.max_replicas == 9
    assert parse_spec_cached(GOOD).scaling.max_replicas == 4
    assert parse_spec_cached({**GOOD, "pollIntervalSeconds": 2}).poll_interval_seconds == 2


def test_an_invalid_spec_raises_on_every_parse_not_only_the_first():
    for value in (0, 0, 0.0):
        with pytest.raises(InvalidSpec, match="spec.maxReplicas="):
            parse_spec_cached({**GOOD, "maxReplicas": value})
    # 1.5 and 1 print differently: the whole number is valid, the fraction is not
    assert parse_spec_cached({**GOOD, "maxReplicas": 1}).scaling.max_replicas == 1
    with pytest.raises(InvalidSpec, match="a whole number"):
        parse_spec_cached({**GOOD, "maxReplicas": 1.5})


def test_a_condition_message_never_shows_a_password():
    conditions = Conditions(None, now=0.0)
    conditions.set("BrokerReachable", False, "BrokerUnreachable", "Redis at redis://:ab/cd+e==@redis:6379/0: refused")
    assert conditions.get("BrokerReachable")["message"] == "Redis at redis://:***@redis:6379/0: refused"


def _pod(name, restarts, last=None, current=None):
    status = {"name": "worker", "restartCount": restarts}
    if last:
        status["lastState"] = {"terminated": last}
    if current:
        status["state"] = {"terminated": current}
    return {"metadata": {"name": name}, "status": {"containerStatuses": [status]}}


def test_terminations_explain_oom_exit_codes_and_liveness_kills():
    pods = [
        _pod("w-oom", 3, {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2026-11-29T10:00:00Z"}),
        _pod("w-err", 1, {"reason": "Error", "exitCode": 2, "finishedAt": "2026-11-29T10:01:00Z"}),
        _pod("w-live", 2, {"reason": "Error", "exitCode": 137, "finishedAt": "2026-11-29T10:02:00Z"}),
        _pod("w-ok", 0),
    ]
    events = [{"reason": "Killing", "message": "Container worker failed liveness probe, will be restarted",
               "involvedObject": {"kind": "Pod", "name": "w-live", "fieldPath": "spec.containers{worker}"},
               "lastTimestamp": "2026-11-29T10:01:30Z"}]
    report = recent_terminations(pods, events)
    assert [(t["pod"], t["reason"], t["exitCode"], t["restartCount"]) for t in report] == [
        ("w-live", "LivenessProbeFailed", 137, 2), ("w-err", "Error", 2, 1), ("w-oom", "OOMKilled", 137, 3)]


def test_terminations_of_deleted_pods_stay_and_the_list_is_bounded():
    old = [{"pod": f"gone-{i}", "container": "worker", "reason": "OOMKilled", "exitCode": 137,
            "finishedAt": f"2026-11-29T09:{i:02d}:00Z", "restartCount": 1} for i in range(12)]
    pods = [_pod("w", 1, {"reason": "Error", "exitCode": 1, "finishedAt": "2026-11-29T10:00:00Z"})]
    report = recent_terminations(pods, [], previous=old, limit=5)
    assert [t["pod"] for t in report] == ["w", "gone-11", "gone-10", "gone-9", "gone-8"]
    again = recent_terminations(pods, [], previous=report, limit=5)
    assert again == report, "the same termination is reported once"


LEASE = {"holderIdentity": "other", "renewTime": "2026-11-29T10:00:00.000000Z", "leaseDurationSeconds": 15}


def test_a_lease_held_by_someone_else_is_taken_only_after_it_stopped_changing_for_its_duration():
    assert may_acquire(None, None, me="me", now_monotonic=0, lease_seconds=15)
    assert may_acquire({**LEASE, "holderIdentity": "me"}, None, me="me", now_monotonic=0, lease_seconds=15)
    assert may_acquire({**LEASE, "holderIdentity": None}, None, me="me", now_monotonic=0, lease_seconds=15)
    seen = Observed("other", LEASE["renewTime"], 100.0)
    assert not may_acquire(LEASE, None, me="me", now_monotonic=500, lease_seconds=15)
    assert not may_acquire(LEASE, seen, me="me", now_monotonic=114, lease_seconds=15)
    assert may_acquire(LEASE, seen, me="me", now_monotonic=116, lease_seconds=15)
    renewed = {**LEASE, "renewTime": "2026-11-29T10:00:02.000000Z"}
    assert not may_acquire(renewed, seen, me="me", now_monotonic=200, lease_seconds=15)


def test_settings_come_from_the_contract_and_a_bad_one_names_the_variable():
    from taskherd.contract import ContractError
    from taskherd.operator.config import OperatorConfig

    config = OperatorConfig.from_env({"POD_NAMESPACE": "shop", "TASKHERD_OPERATOR_HEALTH_PORT": "9000",
                                      "TASKHERD_LEADER_ELECTION": "false"})
    assert config.namespaces == ["shop"] and config.lease_namespace == "shop" and not config.leader_election
    assert config.liveness_endpoint == "http://0.0.0.0:9000/healthz"
    assert OperatorConfig.from_env({"TASKHERD_OPERATOR_HEALTH_PORT": "0"}).liveness_endpoint is None
    with pytest.raises(ContractError) as info:
        OperatorConfig.from_env({"TASKHERD_WORKER_METRICS_PORT": "98080"})
    assert "TASKHERD_WORKER_METRICS_PORT='98080' is invalid" in str(info.value)


def test_pause_annotations_read_as_keda_reads_its_own():
    from taskherd.operator.pause import pause_from

    assert pause_from(None) is None and pause_from({"taskherd.io/paused": "false"}) is None
    assert pause_from({"taskherd.io/paused-replicas": "0"}).replicas == 0
    assert pause_from({"taskherd.io/paused": "true"}).replicas is None
    both = pause_from({"taskherd.io/paused": "true", "taskherd.io/paused-replicas": "3"})
    assert both.replicas == 3, "paused-replicas wins, as in KEDA"
    for bad in ({"taskherd.io/paused-replicas": "-1"}, {"taskherd.io/paused-replicas": "1001"},
                {"taskherd.io/paused": "yes please"}):
        pause = pause_from(bad)
        assert pause.replicas is None and pause.reason == "InvalidPauseAnnotation" and "is invalid" in pause.message
