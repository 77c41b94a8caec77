"""Values a user can get wrong are refused before anything is installed, with the key named."""
from __future__ import annotations

import pytest

from chart_support import BROKER, render, render_error


def pool(**overrides) -> dict:
    return {"name": "p", "app": "tasks", **overrides}


def values_with(*pools: dict, **top) -> dict:
    return {**BROKER, "workerPools": list(pools), **top}


CASES = {
    "no broker Secret": (
        {"workerPools": [pool()]},
        "broker.existingSecret.name: is empty"),
    "soft limit not below hard": (
        values_with(pool(timeLimits={"softSeconds": 300, "hardSeconds": 300})),
        "workerPools[0] (p): timeLimits.softSeconds (300) must be less than timeLimits.hardSeconds (300)"),
    "grace too short for hard limit plus drain": (
        values_with(pool(terminationGracePeriodSeconds=320)),
        "workerPools[0] (p): terminationGracePeriodSeconds (320) is too short: it must be at least "
        "timeLimits.hardSeconds + drainMarginSeconds + shutdownSeconds = 300 + 20 + 10 = 330"),
    "visibility timeout not above hard limit": (
        values_with(pool(timeLimits={"softSeconds": 3000, "hardSeconds": 3600})),
        "broker.visibilityTimeoutSeconds (3600) must be greater than workerPools[0] (p) timeLimits.hardSeconds (3600)"),
    "min replicas above max": (
        values_with(pool(autoscaling={"minReplicas": 4, "maxReplicas": 3})),
        "workerPools[0] (p): autoscaling.minReplicas (4) must not exceed autoscaling.maxReplicas (3)"),
    "autoscaling without the operator": (
        values_with(pool(), operator={"enabled": False}),
        "workerPools[0] (p): autoscaling.enabled is true but operator.enabled is false"),
    "two DLQ page targets": (
        values_with(pool(autoscaling={"deadLetter": {"alertmanagerUrl": "http://a", "webhookUrl": "http://b"}})),
        "autoscaling.deadLetter.alertmanagerUrl and autoscaling.deadLetter.webhookUrl are both set"),
    "autoscaled pool on another metrics port": (
        values_with(pool(metrics={"port": 9100})),
        "workerPools[0] (p): metrics.port (9100) differs from workerPoolDefaults.metrics.port (9891)"),
    "duplicate pool names": (
        values_with(pool(), pool()),
        'workerPools[1] (p): name "p" is used by another pool'),
    "no Celery app": (
        values_with({"name": "p"}),
        "workerPools[0] (p): app is empty"),
    "no queues": (
        values_with(pool(queues=[])),
        "workerPools[0] (p): queues is empty"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_problem_is_refused_with_a_message_naming_the_key(case):
    values, message = CASES[case]
    error = render_error(values=values)
    assert message in error
    assert "1 problem(s)" in error, error


def test_every_problem_is_reported_at_once():
    values = {
        "broker": {"visibilityTimeoutSeconds": 100},
        "workerPools": [
            pool(timeLimits={"softSeconds": 200, "hardSeconds": 150}, terminationGracePeriodSeconds=60,
                 autoscaling={"minReplicas": 5, "maxReplicas": 2}),
            pool(name="q", queues=[]),
        ],
    }
    error = render_error(values=values)
    expected = [
        "broker.existingSecret.name: is empty",
        "workerPools[0] (p): timeLimits.softSeconds (200) must be less than timeLimits.hardSeconds (150)",
        "workerPools[0] (p): terminationGracePeriodSeconds (60) is too short",
        "broker.visibilityTimeoutSeconds (100) must be greater than workerPools[0] (p) timeLimits.hardSeconds (150)",
        "workerPools[0] (p): autoscaling.minReplicas (5) must not exceed autoscaling.maxReplicas (2)",
        "broker.visibilityTimeoutSeconds (100) must be greater than workerPools[1] (q) timeLimits.hardSeconds (300)",
        "workerPools[1] (q): queues is empty",
    ]
    for message in expected:
        assert message in error
    assert f"{len(expected)} problem(s)" in error


def test_visibility_timeout_is_not_checked_on_rabbitmq():
    values = values_with(pool(timeLimits={"softSeconds": 5000, "hardSeconds": 7200}))
    values["broker"] = {**values["broker"], "type": "rabbitmq", "ports": [5672]}
    assert render(values=values)


SCHEMA_CASES = {
    "unknown key (typo)": (values_with(pool(concurency=4)), "additional properties 'concurency' not allowed"),
    "pool name not a DNS label": (values_with(pool(name="Bad_Name")), "/workerPools/0/name"),
    "zero concurrency": (values_with(pool(concurrency=0)), "/workerPools/0/concurrency"),
    "unknown broker type": ({"broker": {"type": "sqs", "existingSecret": {"name": "s"}}}, "/broker/type"),
    "root containers": ({**BROKER, "podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    "writable root filesystem": ({**BROKER, "containerSecurityContext": {"readOnlyRootFilesystem": False}},
                                 "/containerSecurityContext/readOnlyRootFilesystem"),
    "capabilities kept": ({**BROKER, "containerSecurityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
                          "/containerSecurityContext/capabilities/drop"),
}


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=list(SCHEMA_CASES))
def test_schema_refuses_wrong_types_unknown_keys_and_weakened_security(case):
    values, where = SCHEMA_CASES[case]
    error = render_error(values=values)
    assert "values don't meet the specifications of the schema" in error
    assert where in error, error
