"""Bad WorkerPools, as users write them: each refused by the API server (server-side dry run on the
real cluster) with a message that names the field, refused the same way by the operator's own
reading of a spec (policy.parse_spec), and a `kubectl apply` of any of them over a good pool
changes nothing.

Unknown fields are the API server's field validation: kubectl's default (strict) refuses them,
naming the field; with `--validate=warn` the API server prunes them (the CRD's schema is
structural) and kubectl prints a warning naming the field. We rely on that, as every CRD does, and
test both.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from taskherd.operator.policy import InvalidSpec, parse_spec

DELETE = object()
PASSWORD_URL = "redis://:hunter2@redis.shop:6379/0"


def good_spec() -> dict[str, Any]:
    return {"scaleTargetRef": {"name": "workers"},
            "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": ["emails", "reports"]},
            "minReplicas": 0, "maxReplicas": 10}


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(base)
    for key, value in change.items():
        if value is DELETE:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


@dataclass(frozen=True)
class Bad:
    id: str
    change: dict[str, Any]
    #: the field the message must name, as the API server spells the path.
    field: str
    #: words of the message a user reads.
    says: str
    #: the operator refuses it too (False: a range only the schema bounds; the operator could act).
    operator_refuses: bool = True
    #: must not appear anywhere in the answer (a secret pasted in the wrong place).
    never_echoed: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _dlq(queues, dlqs=None):
    broker = {"queues": queues}
    if dlqs is not None:
        broker["deadLetterQueues"] = dlqs
    return {"broker": broker}


CORPUS = [
    # replicas and numbers
    Bad("min-above-max", {"minReplicas": 5, "maxReplicas": 2}, "spec.minReplicas",
        "must be less than or equal to spec.maxReplicas"),
    Bad("max-zero", {"maxReplicas": 0}, "spec.maxReplicas", "should be greater than or equal to 1"),
    Bad("max-huge", {"maxReplicas": 5000}, "spec.maxReplicas", "should be less than or equal to 1000",
        operator_refuses=False),
    Bad("max-missing", {"maxReplicas": DELETE}, "spec.maxReplicas", "Required value", operator_refuses=False),
    Bad("min-negative", {"minReplicas": -1}, "spec.minReplicas", "should be greater than or equal to 0"),
    Bad("max-fraction", {"maxReplicas": 2.5}, "spec.maxReplicas", "must be of type integer"),
    Bad("target-depth-as-text", {"targetDepthPerWorker": "5"}, "spec.targetDepthPerWorker", "must be of type integer"),
    Bad("target-depth-zero", {"targetDepthPerWorker": 0}, "spec.targetDepthPerWorker",
        "should be greater than or equal to 1"),
    Bad("poll-zero", {"pollIntervalSeconds": 0}, "spec.pollIntervalSeconds", "should be greater than or equal to 1"),
    Bad("poll-fifteen-minutes", {"pollIntervalSeconds": 900}, "spec.pollIntervalSeconds",
        "should be less than or equal to 300", operator_refuses=False),
    Bad("age-limit-negative", {"maxOldestMessageAgeSeconds": -3}, "spec.maxOldestMessageAgeSeconds",
        "should be greater than or equal to 1"),
    Bad("age-limit-zero", {"maxOldestMessageAgeSeconds": 0}, "spec.maxOldestMessageAgeSeconds",
        "should be greater than or equal to 1"),
    Bad("window-negative", {"scaleDownStabilizationSeconds": -1}, "spec.scaleDownStabilizationSeconds",
        "should be greater than or equal to 0"),
    Bad("window-two-hours", {"scaleDownStabilizationSeconds": 7200}, "spec.scaleDownStabilizationSeconds",
        "should be less than or equal to 3600", operator_refuses=False),
    # the scale target
    Bad("target-missing", {"scaleTargetRef": DELETE}, "spec.scaleTargetRef", "Required value"),
    Bad("target-name-missing", {"scaleTargetRef": {"name": DELETE}}, "spec.scaleTargetRef.name", "Required value"),
    Bad("target-name-uppercase", {"scaleTargetRef": {"name": "Workers"}}, "spec.scaleTargetRef.name",
        "must be an object name: a DNS-1123 subdomain"),
    Bad("target-name-with-slash", {"scaleTargetRef": {"name": "shop/workers"}}, "spec.scaleTargetRef.name",
        "DNS-1123 subdomain"),
    Bad("target-name-underscore", {"scaleTargetRef": {"name": "mail_workers"}}, "spec.scaleTargetRef.name",
        "DNS-1123 subdomain"),
    Bad("target-kind-lowercase", {"scaleTargetRef": {"kind": "deployment"}}, "spec.scaleTargetRef.kind",
        "must be a Kind such as Deployment"),
    Bad("target-kind-with-group", {"scaleTargetRef": {"kind": "Deployment.apps"}}, "spec.scaleTargetRef.kind",
        "must be a Kind such as Deployment"),
    Bad("target-api-without-version", {"scaleTargetRef": {"apiVersion": "apps"}}, "spec.scaleTargetRef.apiVersion",
        "must be group/version of an API"),
    Bad("target-api-core", {"scaleTargetRef": {"apiVersion": "v1"}}, "spec.scaleTargetRef.apiVersion",
        "must be group/version of an API"),
    # the broker
    Bad("broker-missing", {"broker": DELETE}, "spec.broker", "Required value"),
    Bad("broker-kafka", {"broker": {"type": "kafka"}}, "spec.broker.type", "must be redis or rabbitmq"),
    Bad("broker-capitalised", {"broker": {"type": "Redis"}}, "spec.broker.type", "must be redis or rabbitmq"),
    Bad("secret-missing", {"broker": {"secretRef": DELETE}}, "spec.broker.secretRef", "Required value"),
    Bad("secret-is-a-url-with-password", {"broker": {"secretRef": {"name": PASSWORD_URL}}},
        "spec.broker.secretRef.name", "must be the name of a Secret", never_echoed="hunter2"),
    Bad("secret-uppercase", {"broker": {"secretRef": {"name": "Broker"}}}, "spec.broker.secretRef.name",
        "must be the name of a Secret"),
    Bad("secret-name-too-long", {"broker": {"secretRef": {"name": "b" * 254}}}, "spec.broker.secretRef.name",
        "Too long"),
    Bad("secret-key-with-space", {"broker": {"secretRef": {"key": "broker url"}}}, "spec.broker.secretRef.key",
        "must be a key of the Secret's data"),
    Bad("secret-key-empty", {"broker": {"secretRef": {"key": ""}}}, "spec.broker.secretRef.key",
        "should be at least 1 chars long"),
    Bad("management-key-on-redis", {"broker": {"secretRef": {"managementUrlKey": "management-url"}}},
        "spec.broker.secretRef.managementUrlKey", "applies only to broker type rabbitmq"),
    Bad("keyprefix-on-rabbitmq", {"broker": {"type": "rabbitmq", "globalKeyprefix": "shop:"}},
        "spec.broker.globalKeyprefix", "applies only to broker type redis"),
    Bad("queues-empty", _dlq([]), "spec.broker.queues", "should have at least 1 items"),
    Bad("queue-name-empty", _dlq([""]), "spec.broker.queues[0]", "should be at least 1 chars long"),
    Bad("queues-repeated", _dlq(["emails", "emails"]), "spec.broker.queues[1]", "Duplicate value",
        operator_refuses=False),
    Bad("queue-name-too-long", _dlq(["q" * 300]), "spec.broker.queues[0]", "Too long", operator_refuses=False),
    Bad("dlq-is-a-work-queue", _dlq(["emails", "reports"], ["emails.dlq", "emails"]), "spec.broker.deadLetterQueues",
        "must not name a work queue"),
    Bad("dlq-count-differs", _dlq(["emails", "reports"], ["failed"]), "spec.broker.deadLetterQueues",
        "one dead-letter queue per queue"),
    Bad("default-dlq-is-a-work-queue", _dlq(["emails", "emails.dlq"]), "spec.broker.queues",
        "its default dead-letter queue"),
    Bad("dlq-shared", _dlq(["emails", "reports"], ["failed", "failed"]), "spec.broker.deadLetterQueues[1]",
        "Duplicate value"),
    # paging
    Bad("two-page-targets", {"deadLetter": {"alertmanagerUrl": "http://am:9093", "webhookUrl": "https://hooks.shop/dlq"}},
        "spec.deadLetter.webhookUrl", "set alertmanagerUrl or webhookUrl, not both"),
    Bad("webhook-scheme-only", {"deadLetter": {"webhookUrl": "http://"}}, "spec.deadLetter.webhookUrl",
        "must be an http:// or https:// URL with a host"),
    Bad("webhook-with-space", {"deadLetter": {"webhookUrl": "https://hooks.shop/dead letters"}},
        "spec.deadLetter.webhookUrl", "no spaces"),
    Bad("webhook-not-a-url", {"deadLetter": {"webhookUrl": "not a url"}}, "spec.deadLetter.webhookUrl",
        "must be an http:// or https:// URL"),
    Bad("alertmanager-trailing-space", {"deadLetter": {"alertmanagerUrl": "http://am:9093 "}},
        "spec.deadLetter.alertmanagerUrl", "no spaces"),
    Bad("alertmanager-ftp", {"deadLetter": {"alertmanagerUrl": "ftp://am"}}, "spec.deadLetter.alertmanagerUrl",
        "must be an http:// or https:// URL"),
    Bad("alertmanager-without-scheme", {"deadLetter": {"alertmanagerUrl": "alertmanager:9093"}},
        "spec.deadLetter.alertmanagerUrl", "must be an http:// or https:// URL"),
    Bad("alertmanager-with-query", {"deadLetter": {"alertmanagerUrl": "http://am:9093/?silence=1"}},
        "spec.deadLetter.alertmanagerUrl", "without ?query or #fragment"),
    Bad("severity-unknown", {"deadLetter": {"severity": "urgent"}}, "spec.deadLetter.severity", "Unsupported value"),
    Bad("threshold-zero", {"deadLetter": {"threshold": 0}}, "spec.deadLetter.threshold",
        "should be greater than or equal to 1"),
    Bad("threshold-as-text", {"deadLetter": {"threshold": "1"}}, "spec.deadLetter.threshold", "must be of type integer"),
    Bad("resend-too-often", {"deadLetter": {"resendIntervalSeconds": 5}}, "spec.deadLetter.resendIntervalSeconds",
        "should be greater than or equal to 10", operator_refuses=False),
    Bad("resend-hourly", {"deadLetter": {"resendIntervalSeconds": 3600}}, "spec.deadLetter.resendIntervalSeconds",
        "should be less than or equal to 600", operator_refuses=False),
]

#: specs the rules must NOT refuse (so that a rule cannot pass the corpus by refusing everything).
GOOD = [
    ("defaults", {}),
    ("statefulset", {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "workers"}}),
    ("custom-resource", {"scaleTargetRef": {"apiVersion": "e2e.taskherd.io/v1beta1", "kind": "WorkerClaim",
                                            "name": "claims.v2"}}),
    ("rabbitmq", {"broker": {"type": "rabbitmq", "secretRef": {"name": "broker", "key": "amqp-url",
                                                               "managementUrlKey": "management_url"}}}),
    ("redis-prefix", {"broker": {"globalKeyprefix": "shop:"}}),
    ("own-dlqs", _dlq(["emails", "reports"], ["emails.failed", "reports.failed"])),
    ("webhook", {"deadLetter": {"webhookUrl": "https://hooks.shop:8443/taskherd?token=abc", "severity": "critical"}}),
    ("alertmanager", {"deadLetter": {"alertmanagerUrl": "http://alertmanager.monitoring.svc:9093/"}}),
]


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 40 and len({bad.id for bad in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("bad", [b for b in CORPUS if b.operator_refuses], ids=lambda b: b.id)
def test_the_operator_refuses_what_the_api_server_refuses(bad):
    with pytest.raises(InvalidSpec) as info:
        parse_spec(merged(good_spec(), bad.change))
    assert bad.field.split("[")[0] in str(info.value), str(info.value)
    if bad.never_echoed:
        assert bad.never_echoed not in str(info.value)


@pytest.mark.parametrize("change", [g[1] for g in GOOD], ids=[g[0] for g in GOOD])
def test_the_operator_accepts_the_good_variants(change):
    parse_spec(merged(good_spec(), change))


def manifest(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "taskherd.io/v1alpha1", "kind": "WorkerPool", "metadata": {"name": name},
                       "spec": spec})


@pytest.mark.cluster
def test_the_api_server_refuses_every_bad_workerpool_naming_the_field(cluster, namespace):
    wrong = []
    for bad in CORPUS:
        spec = merged(good_spec(), bad.change)
        answer = cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-",
                                 input=manifest("bad", spec), check=False)
        said = answer.stdout + answer.stderr
        if answer.returncode == 0 or bad.field not in said or bad.says not in said or \
                (bad.never_echoed and bad.never_echoed in said):
            wrong.append(f"{bad.id}: exit {answer.returncode}: {said.strip()[:400]}")
    assert wrong == [], "\n".join(wrong)
    for name, change in GOOD:
        cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-",
                        input=manifest(f"good-{name}", merged(good_spec(), change)))


@pytest.mark.cluster
def test_kubectl_apply_of_a_bad_workerpool_changes_nothing(cluster, namespace):
    cluster.apply(manifest("pool", good_spec()), namespace)
    before = cluster.kubectl_json("-n", namespace, "get", "wp", "pool")
    spec = before["spec"]  # the defaults a user did not write
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "workers"}
    assert (spec["broker"]["secretRef"]["key"], spec["targetDepthPerWorker"], spec["pollIntervalSeconds"],
            spec["scaleDownStabilizationSeconds"]) == ("url", 5, 5, 300)
    accepted = [bad.id for bad in CORPUS
                if cluster.kubectl("-n", namespace, "apply", "-f", "-", input=manifest("pool", merged(
                    good_spec(), bad.change)), check=False).returncode == 0]
    after = cluster.kubectl_json("-n", namespace, "get", "wp", "pool")
    assert accepted == []
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"] == before["spec"]
    missing = cluster.kubectl("-n", namespace, "get", "wp", "bad", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


@pytest.mark.cluster
def test_an_unknown_field_is_refused_by_default_and_pruned_with_a_warning_when_asked(cluster, namespace):
    typo = merged(good_spec(), {"targetDepthPerWoker": 2})
    strict = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=manifest("typo", typo), check=False)
    assert strict.returncode != 0 and 'unknown field "spec.targetDepthPerWoker"' in strict.stderr
    warned = cluster.kubectl("-n", namespace, "apply", "--validate=warn", "-f", "-", input=manifest("typo", typo))
    assert 'unknown field "spec.targetDepthPerWoker"' in warned.stderr, warned.stderr
    stored = cluster.kubectl_json("-n", namespace, "get", "wp", "typo")["spec"]
    assert "targetDepthPerWoker" not in stored and stored["targetDepthPerWorker"] == 5
