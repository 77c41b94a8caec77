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
import re
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
    #: must not appear anywhere in the answer (a secret pasted in the wrong place).
    never_echoed: str | None = None
    #: sent to the API server too (False: a value JSON cannot carry, such as inf or nan: kubectl
    #: refuses it before sending; only a stored or hand-built spec reaches the operator with it).
    sent_to_api: bool = True
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
    Bad("max-huge", {"maxReplicas": 5000}, "spec.maxReplicas", "should be less than or equal to 1000"),
    Bad("max-missing", {"maxReplicas": DELETE}, "spec.maxReplicas", "Required value"),
    Bad("min-negative", {"minReplicas": -1}, "spec.minReplicas", "should be greater than or equal to 0"),
    Bad("max-fraction", {"maxReplicas": 2.5}, "spec.maxReplicas", "must be of type integer"),
    Bad("target-depth-as-text", {"targetDepthPerWorker": "5"}, "spec.targetDepthPerWorker", "must be of type integer"),
    Bad("target-depth-zero", {"targetDepthPerWorker": 0}, "spec.targetDepthPerWorker",
        "should be greater than or equal to 1"),
    Bad("poll-zero", {"pollIntervalSeconds": 0}, "spec.pollIntervalSeconds", "should be greater than or equal to 1"),
    Bad("poll-fifteen-minutes", {"pollIntervalSeconds": 900}, "spec.pollIntervalSeconds",
        "should be less than or equal to 300"),
    Bad("age-limit-negative", {"maxOldestMessageAgeSeconds": -3}, "spec.maxOldestMessageAgeSeconds",
        "should be greater than or equal to 1"),
    Bad("age-limit-zero", {"maxOldestMessageAgeSeconds": 0}, "spec.maxOldestMessageAgeSeconds",
        "should be greater than or equal to 1"),
    Bad("window-negative", {"scaleDownStabilizationSeconds": -1}, "spec.scaleDownStabilizationSeconds",
        "should be greater than or equal to 0"),
    Bad("window-two-hours", {"scaleDownStabilizationSeconds": 7200}, "spec.scaleDownStabilizationSeconds",
        "should be less than or equal to 3600"),
    Bad("min-as-bool", {"minReplicas": True}, "spec.minReplicas", "must be of type integer"),
    Bad("min-as-text", {"minReplicas": "0"}, "spec.minReplicas", "must be of type integer"),
    Bad("max-negative", {"maxReplicas": -3}, "spec.maxReplicas", "should be greater than or equal to 1"),
    Bad("age-limit-a-day-and-more", {"maxOldestMessageAgeSeconds": 86401}, "spec.maxOldestMessageAgeSeconds",
        "should be less than or equal to 86400"),
    # values JSON cannot carry: int(inf) and int(nan) were an OverflowError and a ValueError in the operator
    Bad("max-infinite", {"maxReplicas": float("inf")}, "spec.maxReplicas", "a whole number", sent_to_api=False),
    Bad("max-nan", {"maxReplicas": float("nan")}, "spec.maxReplicas", "a whole number", sent_to_api=False),
    Bad("threshold-infinite", {"deadLetter": {"threshold": float("inf")}}, "spec.deadLetter.threshold",
        "a whole number", sent_to_api=False),
    Bad("poll-infinite", {"pollIntervalSeconds": float("inf")}, "spec.pollIntervalSeconds",
        "a whole number from 1 to 300", sent_to_api=False),
    Bad("age-limit-infinite", {"maxOldestMessageAgeSeconds": float("inf")}, "spec.maxOldestMessageAgeSeconds",
        "a whole number from 1 to 86400", sent_to_api=False),
    # null reaches only a spec built by hand (the API server prunes it): a TypeError in the operator before
    Bad("max-null", {"maxReplicas": None}, "spec.maxReplicas", "a whole number from 1 to 1000", sent_to_api=False),
    Bad("min-null", {"minReplicas": None}, "spec.minReplicas", "a whole number from 0 to 1000", sent_to_api=False),
    Bad("threshold-null", {"deadLetter": {"threshold": None}}, "spec.deadLetter.threshold",
        "a whole number from 1 to 1000000", sent_to_api=False),
    # a typo the API server prunes (or kubectl refuses, test below); by hand it was silently the default
    Bad("max-typo", {"maxReplica": 10}, "spec.maxReplica", "one of the fields of spec: ", sent_to_api=False),
    Bad("target-depth-typo", {"targetDepthPerWoker": 2}, "spec.targetDepthPerWoker", "targetDepthPerWorker",
        sent_to_api=False),
    Bad("threshold-typo", {"deadLetter": {"treshold": 3}}, "spec.deadLetter.treshold",
        "one of the fields of spec.deadLetter: threshold", sent_to_api=False),
    Bad("secret-key-typo", {"broker": {"secretRef": {"keys": "url"}}}, "spec.broker.secretRef.keys",
        "one of the fields of spec.broker.secretRef: name, key", sent_to_api=False),
    Bad("target-depth-half-a-million", {"targetDepthPerWorker": 500_000}, "spec.targetDepthPerWorker",
        "should be less than or equal to 100000"),
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
    Bad("target-name-trailing-newline", {"scaleTargetRef": {"name": "workers\n"}}, "spec.scaleTargetRef.name",
        "DNS-1123 subdomain"),
    Bad("target-kind-trailing-newline", {"scaleTargetRef": {"kind": "Deployment\n"}}, "spec.scaleTargetRef.kind",
        "must be a Kind such as Deployment"),
    Bad("target-api-trailing-newline", {"scaleTargetRef": {"apiVersion": "apps/v1\n"}},
        "spec.scaleTargetRef.apiVersion", "must be group/version of an API"),
    # an object written as a string or a list was an AttributeError in the operator ('str'.get)
    Bad("target-as-text", {"scaleTargetRef": "workers"}, "spec.scaleTargetRef", "must be of type object"),
    Bad("target-name-empty", {"scaleTargetRef": {"name": ""}}, "spec.scaleTargetRef.name",
        "should be at least 1 chars long"),
    Bad("target-name-too-long", {"scaleTargetRef": {"name": "w" * 254}}, "spec.scaleTargetRef.name", "Too long"),
    Bad("target-name-as-number", {"scaleTargetRef": {"name": 5}}, "spec.scaleTargetRef.name",
        "must be of type string"),
    # the broker
    Bad("broker-missing", {"broker": DELETE}, "spec.broker", "Required value"),
    Bad("broker-kafka", {"broker": {"type": "kafka"}}, "spec.broker.type", "must be redis or rabbitmq"),
    Bad("broker-capitalised", {"broker": {"type": "Redis"}}, "spec.broker.type", "must be redis or rabbitmq"),
    Bad("broker-type-empty", {"broker": {"type": ""}}, "spec.broker.type", "must be redis or rabbitmq"),
    Bad("broker-as-url", {"broker": PASSWORD_URL}, "spec.broker", "must be of type object", never_echoed="hunter2"),
    Bad("secret-as-text", {"broker": {"secretRef": "broker"}}, "spec.broker.secretRef", "must be of type object"),
    Bad("secret-name-empty", {"broker": {"secretRef": {"name": ""}}}, "spec.broker.secretRef.name",
        "should be at least 1 chars long"),
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
    Bad("secret-name-trailing-newline", {"broker": {"secretRef": {"name": "broker\n"}}}, "spec.broker.secretRef.name",
        "must be the name of a Secret"),
    Bad("secret-key-trailing-newline", {"broker": {"secretRef": {"key": "url\n"}}}, "spec.broker.secretRef.key",
        "must be a key of the Secret's data"),
    Bad("management-key-trailing-newline",
        {"broker": {"type": "rabbitmq", "secretRef": {"managementUrlKey": "management-url\n"}}},
        "spec.broker.secretRef.managementUrlKey", "must be a key of the Secret's data"),
    Bad("management-key-on-redis", {"broker": {"secretRef": {"managementUrlKey": "management-url"}}},
        "spec.broker.secretRef.managementUrlKey", "applies only to broker type rabbitmq"),
    Bad("keyprefix-on-rabbitmq", {"broker": {"type": "rabbitmq", "globalKeyprefix": "shop:"}},
        "spec.broker.globalKeyprefix", "applies only to broker type redis"),
    Bad("keyprefix-as-number", {"broker": {"globalKeyprefix": 5}}, "spec.broker.globalKeyprefix",
        "must be of type string"),
    Bad("keyprefix-too-long", {"broker": {"globalKeyprefix": "p" * 256}}, "spec.broker.globalKeyprefix", "Too long"),
    Bad("queues-as-text", _dlq("emails,reports"), "spec.broker.queues", "must be of type array"),
    Bad("queue-name-as-number", _dlq([5]), "spec.broker.queues[0]", "must be of type string"),
    Bad("queues-empty", _dlq([]), "spec.broker.queues", "should have at least 1 items"),
    Bad("queue-name-empty", _dlq([""]), "spec.broker.queues[0]", "should be at least 1 chars long"),
    Bad("queues-repeated", _dlq(["emails", "emails"]), "spec.broker.queues[1]", "Duplicate value"),
    Bad("queue-name-too-long", _dlq(["q" * 300]), "spec.broker.queues[0]", "Too long"),
    Bad("queues-too-many", _dlq([f"q{i}" for i in range(65)]), "spec.broker.queues", "Too many"),
    Bad("queue-name-with-comma", _dlq(["emails,reports"]), "spec.broker.queues[0]", "without commas"),
    Bad("queue-name-with-no-break-space", _dlq(["emails\u00a0eu"]), "spec.broker.queues[0]", "without commas"),
    Bad("dlq-name-with-space", _dlq(["emails"], ["emails dlq"]), "spec.broker.deadLetterQueues[0]", "without commas"),
    # 252 characters: its default dead-letter queue would be 256
    Bad("queue-too-long-for-its-dlq", _dlq(["q" * 252]), "spec.broker.queues", "at most 251 bytes"),
    # RabbitMQ counts UTF-8 bytes, maxLength characters: 200 "é" are 400 bytes (the broker refused the
    # queue, its management API answered 404, read as an empty queue: the pool sat at minReplicas)
    Bad("queue-name-over-255-bytes", _dlq(["\u00e9" * 200]), "spec.broker.queues", "at most 255 bytes"),
    Bad("dlq-name-over-255-bytes", _dlq(["emails", "reports"], ["\u00e9" * 128, "reports.dlq"]),
        "spec.broker.deadLetterQueues", "at most 255 bytes"),
    # 126 characters, 252 bytes: its default dead-letter queue would be 256 bytes
    Bad("queue-too-many-bytes-for-its-dlq", _dlq(["\u00e9" * 126]), "spec.broker.queues", "at most 251 bytes"),
    # invisible format characters (Unicode Cf): a queue that looks like another
    Bad("queue-name-zero-width-space", _dlq(["emails\u200b"]), "spec.broker.queues", "invisible format characters"),
    Bad("queue-name-byte-order-mark", _dlq(["\ufeffemails"]), "spec.broker.queues", "invisible format characters"),
    Bad("queue-name-soft-hyphen", _dlq(["e\u00admails"]), "spec.broker.queues", "invisible format characters"),
    Bad("dlq-name-zero-width-joiner", _dlq(["emails"], ["emails\u200d.dlq"]), "spec.broker.deadLetterQueues",
        "invisible format characters"),
    # a final newline: RE2's '$' is the end of the text; Python's re.match took "emails\n" for "emails"
    Bad("queue-name-trailing-newline", _dlq(["emails\n"]), "spec.broker.queues[0]", "without commas"),
    Bad("dlq-name-trailing-newline", _dlq(["emails"], ["emails.dlq\n"]), "spec.broker.deadLetterQueues[0]",
        "without commas"),
    Bad("dlq-is-a-work-queue", _dlq(["emails", "reports"], ["emails.dlq", "emails"]), "spec.broker.deadLetterQueues",
        "must not name a work queue"),
    Bad("dlq-count-differs", _dlq(["emails", "reports"], ["failed"]), "spec.broker.deadLetterQueues",
        "one dead-letter queue per queue"),
    Bad("default-dlq-is-a-work-queue", _dlq(["emails", "emails.dlq"]), "spec.broker.queues",
        "its default dead-letter queue"),
    Bad("dlq-shared", _dlq(["emails", "reports"], ["failed", "failed"]), "spec.broker.deadLetterQueues[1]",
        "Duplicate value"),
    # read letter by letter before: "names 6 dead-letter queue(s) for 2 queue(s)"
    Bad("dlqs-as-text", _dlq(["emails", "reports"], "failed"), "spec.broker.deadLetterQueues",
        "must be of type array"),
    Bad("dlq-name-as-number", _dlq(["emails", "reports"], [1, 2]), "spec.broker.deadLetterQueues[0]",
        "must be of type string"),
    Bad("dlq-name-empty", _dlq(["emails", "reports"], ["", "reports.dlq"]), "spec.broker.deadLetterQueues[0]",
        "should be at least 1 chars long"),
    Bad("dlq-name-too-long", _dlq(["emails", "reports"], ["d" * 256, "reports.dlq"]),
        "spec.broker.deadLetterQueues[0]", "Too long"),
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
    Bad("severity-empty", {"deadLetter": {"severity": ""}}, "spec.deadLetter.severity", "Unsupported value"),
    Bad("dead-letter-as-list", {"deadLetter": ["alertmanager"]}, "spec.deadLetter", "must be of type object"),
    # urllib raised ValueError('Invalid IPv6 URL') in the operator; the API server's isURL() refuses both
    Bad("webhook-unclosed-ipv6", {"deadLetter": {"webhookUrl": "http://[::1/hook"}}, "spec.deadLetter.webhookUrl",
        "must be an http:// or https:// URL"),
    Bad("alertmanager-port-too-big", {"deadLetter": {"alertmanagerUrl": "http://am:99999"}},
        "spec.deadLetter.alertmanagerUrl", "port from 1 to 65535"),
    Bad("alertmanager-port-zero", {"deadLetter": {"alertmanagerUrl": "http://am:0"}},
        "spec.deadLetter.alertmanagerUrl", "port from 1 to 65535"),
    Bad("webhook-port-zero", {"deadLetter": {"webhookUrl": "https://[fd00::1]:0/hook"}},
        "spec.deadLetter.webhookUrl", "port from 1 to 65535"),
    Bad("alertmanager-with-fragment", {"deadLetter": {"alertmanagerUrl": "http://am:9093/#silences"}},
        "spec.deadLetter.alertmanagerUrl", "without ?query or #fragment"),
    Bad("webhook-bad-escape", {"deadLetter": {"webhookUrl": "https://hooks.shop/dead%zzletters"}},
        "spec.deadLetter.webhookUrl", "must be an http:// or https:// URL"),
    Bad("webhook-no-break-space", {"deadLetter": {"webhookUrl": "https://hooks.shop/dead\u00a0letters"}},
        "spec.deadLetter.webhookUrl", "no spaces"),
    Bad("alertmanager-port-not-a-number", {"deadLetter": {"alertmanagerUrl": "http://am:port/"}},
        "spec.deadLetter.alertmanagerUrl", "must be an http:// or https:// URL"),
    # the API server's url() reads '09093' as 9093 and 'am:' as no port; the operator refused both,
    # stopping the pool (Ready=False InvalidSpec) after the API server had stored it
    Bad("webhook-port-leading-zero", {"deadLetter": {"webhookUrl": "http://am:09093/"}},
        "spec.deadLetter.webhookUrl", "without leading zeros"),
    Bad("alertmanager-port-leading-zero", {"deadLetter": {"alertmanagerUrl": "http://am:00080"}},
        "spec.deadLetter.alertmanagerUrl", "without leading zeros"),
    Bad("alertmanager-colon-without-port", {"deadLetter": {"alertmanagerUrl": "http://am:/"}},
        "spec.deadLetter.alertmanagerUrl", "no ':' after the host without a port"),
    Bad("webhook-colon-without-port-at-end", {"deadLetter": {"webhookUrl": "https://hooks.shop:"}},
        "spec.deadLetter.webhookUrl", "no ':' after the host without a port"),
    Bad("webhook-ipv6-colon-without-port", {"deadLetter": {"webhookUrl": "http://[fd00::1]:/hook"}},
        "spec.deadLetter.webhookUrl", "no ':' after the host without a port"),
    Bad("webhook-too-long", {"deadLetter": {"webhookUrl": "https://hooks.shop/" + "x" * 2048}},
        "spec.deadLetter.webhookUrl", "Too long"),
    Bad("threshold-zero", {"deadLetter": {"threshold": 0}}, "spec.deadLetter.threshold",
        "should be greater than or equal to 1"),
    Bad("threshold-as-text", {"deadLetter": {"threshold": "1"}}, "spec.deadLetter.threshold", "must be of type integer"),
    Bad("resend-too-often", {"deadLetter": {"resendIntervalSeconds": 5}}, "spec.deadLetter.resendIntervalSeconds",
        "should be greater than or equal to 10"),
    Bad("resend-hourly", {"deadLetter": {"resendIntervalSeconds": 3600}}, "spec.deadLetter.resendIntervalSeconds",
        "should be less than or equal to 600"),
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
    ("bounds-low", {"minReplicas": 0, "maxReplicas": 1, "targetDepthPerWorker": 1, "maxOldestMessageAgeSeconds": 1,
                    "pollIntervalSeconds": 1, "scaleDownStabilizationSeconds": 0,
                    "deadLetter": {"threshold": 1, "resendIntervalSeconds": 10}}),
    ("bounds-high", {"minReplicas": 1000, "maxReplicas": 1000, "targetDepthPerWorker": 100_000,
                     "maxOldestMessageAgeSeconds": 86_400, "pollIntervalSeconds": 300,
                     "scaleDownStabilizationSeconds": 3600,
                     "deadLetter": {"threshold": 1_000_000, "resendIntervalSeconds": 600}}),
    ("longest-names", _dlq(["q" * 251, "r" * 255], ["q" * 251 + ".dlq", "d" * 255])),
    ("sixty-four-queues", _dlq([f"q{i}" for i in range(64)])),
    ("webhook-highest-port-and-escapes", {"deadLetter": {"webhookUrl": "https://hooks.shop:65535/a%20b?x=%zz"}}),
    # bytes, not characters: 125 "é" and one "a" are 251 bytes, 127 "é" and one "a" 255
    ("longest-names-in-bytes", _dlq(["\u00e9" * 125 + "a", "\u00e9" * 127 + "a"],
                                    ["\u00e9" * 127 + "b", "d\u00e9" * 85])),
    ("longest-name-in-bytes-with-its-dlq", _dlq(["\u00e9" * 125 + "a"])),
    ("non-ascii-queue-names", _dlq(["caf\u00e9", "\u65e5\u672c", "emails-\u00fc"])),
    ("webhook-ipv6-port-and-user", {"deadLetter": {"webhookUrl": "http://hook@[fd00::1]:9093/x?a=b:"}}),
    ("alertmanager-lowest-port", {"deadLetter": {"alertmanagerUrl": "http://am:1/"}}),
]


def test_the_corpus_is_large_enough():
    assert len(CORPUS) >= 40 and len({bad.id for bad in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("bad", CORPUS, ids=lambda b: b.id)
def test_the_operator_refuses_what_the_api_server_refuses(bad):
    with pytest.raises(InvalidSpec) as info:
        parse_spec(merged(good_spec(), bad.change))
    assert bad.field.split("[")[0] in str(info.value), str(info.value)
    if not bad.sent_to_api:  # no API server message to compare with: the operator's own words
        assert bad.says in str(info.value), str(info.value)
    if bad.never_echoed:
        assert bad.never_echoed not in str(info.value)


@pytest.mark.parametrize("change", [g[1] for g in GOOD], ids=[g[0] for g in GOOD])
def test_the_operator_accepts_the_good_variants(change):
    parse_spec(merged(good_spec(), change))


def workerpool(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "taskherd.io/v1alpha1", "kind": "WorkerPool", "metadata": {"name": name}, "spec": spec}


def manifests(specs: dict[str, dict[str, Any]]) -> str:
    """One List of WorkerPools: kubectl sends each to the API server and reports each refusal."""
    return json.dumps({"apiVersion": "v1", "kind": "List",
                       "items": [workerpool(name, spec) for name, spec in specs.items()]})


def refusals(cluster, namespace: str, verb: list[str], specs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """name -> what the API server said when it refused that WorkerPool ('' when it was accepted).

    `--validate=false`: for a List, kubectl would otherwise check types and required fields itself
    and send nothing; here the API server, which every client meets, is the judge."""
    answer = cluster.kubectl("-n", namespace, *verb, "--validate=false", "-f", "-", input=manifests(specs),
                             check=False)
    said = dict.fromkeys(specs, "")
    for chunk in re.split(r"(?=Error from server)", answer.stderr):
        named = re.search(r'"([a-z0-9-]+)" is invalid', chunk)
        if named and named.group(1) in said:
            said[named.group(1)] += chunk
    return said


#: what a user can send to the API server (JSON carries no inf or nan).
API_CORPUS = [bad for bad in CORPUS if bad.sent_to_api]


def bad_specs() -> dict[str, dict[str, Any]]:
    return {f"bad-{bad.id}": merged(good_spec(), bad.change) for bad in API_CORPUS}


@pytest.mark.cluster
def test_the_api_server_refuses_every_bad_workerpool_naming_the_field(cluster, namespace):
    said = refusals(cluster, namespace, ["create", "--dry-run=server"], bad_specs())
    wrong = [f"{bad.id}: {said[f'bad-{bad.id}'].strip()[:400] or 'accepted'}" for bad in API_CORPUS
             if bad.field not in said[f"bad-{bad.id}"] or bad.says not in said[f"bad-{bad.id}"]
             or (bad.never_echoed and bad.never_echoed in said[f"bad-{bad.id}"])]
    assert wrong == [], "\n".join(wrong)
    good = refusals(cluster, namespace, ["create", "--dry-run=server"],
                    {f"good-{name}": merged(good_spec(), change) for name, change in GOOD})
    assert {name: text for name, text in good.items() if text} == {}


@pytest.mark.cluster
def test_kubectl_apply_of_a_bad_workerpool_changes_nothing(cluster, namespace):
    names = list(bad_specs())
    assert not any(refusals(cluster, namespace, ["apply"], dict.fromkeys(names, good_spec())).values())
    before = {p["metadata"]["name"]: p for p in cluster.kubectl_json("-n", namespace, "get", "wp")["items"]}
    spec = before[names[0]]["spec"]  # the defaults a user did not write
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "workers"}
    assert (spec["broker"]["secretRef"]["key"], spec["targetDepthPerWorker"], spec["pollIntervalSeconds"],
            spec["scaleDownStabilizationSeconds"]) == ("url", 5, 5, 300)

    said = refusals(cluster, namespace, ["apply"], bad_specs())
    assert [name for name, text in said.items() if not text] == [], "applied over a good pool"
    after = {p["metadata"]["name"]: p for p in cluster.kubectl_json("-n", namespace, "get", "wp")["items"]}
    changed = [name for name in names if (after[name]["metadata"]["resourceVersion"], after[name]["spec"])
               != (before[name]["metadata"]["resourceVersion"], before[name]["spec"])]
    assert changed == [] and set(after) == set(before)


@pytest.mark.cluster
def test_an_unknown_field_is_refused_by_default_and_pruned_with_a_warning_when_asked(cluster, namespace):
    typo = json.dumps(workerpool("typo", merged(good_spec(), {"targetDepthPerWoker": 2})))
    strict = cluster.kubectl("-n", namespace, "apply", "-f", "-", input=typo, check=False)
    assert strict.returncode != 0 and 'unknown field "spec.targetDepthPerWoker"' in strict.stderr
    warned = cluster.kubectl("-n", namespace, "apply", "--validate=warn", "-f", "-", input=typo)
    assert 'unknown field "spec.targetDepthPerWoker"' in warned.stderr, warned.stderr
    stored = cluster.kubectl_json("-n", namespace, "get", "wp", "typo")["spec"]
    assert "targetDepthPerWoker" not in stored and stored["targetDepthPerWorker"] == 5
