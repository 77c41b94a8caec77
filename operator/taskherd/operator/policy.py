"""A WorkerPool's spec read once into typed values, with the defaults documented in one place.

The API server already refuses bad specs (OpenAPI schema + CEL rules in the CRD); this module
re-checks the rules the operator depends on (formats, exclusive and broker-specific fields, the
dead-letter queues; not the upper bounds of ranges it can act on anyway), so that a pool stored
before the CRD was tightened, or a unit test, fails with a clear message instead of a confusing
decision later. The corpus of bad pools in tests/operator runs through both.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import urlsplit

from taskherd import contract

from .status import redact

#: Poll interval when the spec does not say.
DEFAULT_POLL_INTERVAL_SECONDS = 5.0
#: Scale-down window: the HPA's default, so that nobody is surprised by faster scale-down.
DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS = 300.0
#: Dead letters that page when the spec has a deadLetter block without a threshold.
DEFAULT_DEAD_LETTER_THRESHOLD = 1
#: Alertmanager expects firing alerts to be re-sent; Prometheus does it every minute.
DEFAULT_RESEND_INTERVAL_SECONDS = 60.0
DEFAULT_SEVERITY = "warning"
BROKER_TYPES = ("redis", "rabbitmq")
#: valid specs whose parse is kept (parse_spec_cached): more than the pools one operator polls.
MAX_PARSED_SPECS = 4096
SEVERITIES = ("info", "warning", "critical", "page")

# The formats the CRD's CEL rules check, in the same words.
#: an object name (Deployment, Secret, ...): a DNS-1123 subdomain.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: a key of a Secret's data.
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
#: a Kind: CamelCase, as in Deployment or StatefulSet.
KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
#: group/version of an API with a scale subresource (core v1 has none worth scaling here).
API_VERSION = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/v[0-9]+((alpha|beta)[0-9]+)?$")


class InvalidSpec(ValueError):
    """A spec value outside its valid range; the message names the key, the value and the range."""


@dataclass(frozen=True, kw_only=True)
class ScalingPolicy:
    min_replicas: int
    max_replicas: int
    target_depth_per_worker: int
    max_oldest_message_age_seconds: float | None = None
    scale_down_stabilization_seconds: float = DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS

    def __post_init__(self) -> None:
        _check(self.min_replicas >= 0, "minReplicas", self.min_replicas, ">= 0")
        _check(self.max_replicas >= 1, "maxReplicas", self.max_replicas, ">= 1")
        _check(self.min_replicas <= self.max_replicas, "minReplicas", self.min_replicas,
               f"<= maxReplicas ({self.max_replicas})")
        _check(self.target_depth_per_worker >= 1, "targetDepthPerWorker", self.target_depth_per_worker, ">= 1")
        if self.max_oldest_message_age_seconds is not None:
            _check(self.max_oldest_message_age_seconds > 0, "maxOldestMessageAgeSeconds",
                   self.max_oldest_message_age_seconds, "> 0")
        _check(self.scale_down_stabilization_seconds >= 0, "scaleDownStabilizationSeconds",
               self.scale_down_stabilization_seconds, ">= 0")


@dataclass(frozen=True, kw_only=True)
class ScaleTargetRef:
    """Any object with a scale subresource: a Deployment, a StatefulSet, a custom resource."""

    api_version: str = "apps/v1"
    kind: str = "Deployment"
    name: str

    @property
    def group(self) -> str:
        return self.api_version.split("/", 1)[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/", 1)[1]

    def describe(self, namespace: str) -> str:
        return f"{self.kind} {namespace}/{self.name}"


@dataclass(frozen=True, kw_only=True)
class BrokerSpec:
    type: str
    secret_name: str
    secret_key: str = "url"
    management_url_key: str | None = None
    queues: tuple[str, ...] = ()
    dead_letter_queues: tuple[str, ...] = ()
    global_keyprefix: str = ""


@dataclass(frozen=True, kw_only=True)
class DeadLetterSpec:
    threshold: int = DEFAULT_DEAD_LETTER_THRESHOLD
    alertmanager_url: str | None = None
    webhook_url: str | None = None
    severity: str = DEFAULT_SEVERITY
    resend_interval_seconds: float = DEFAULT_RESEND_INTERVAL_SECONDS


@dataclass(frozen=True, kw_only=True)
class PoolSpec:
    target: ScaleTargetRef
    broker: BrokerSpec
    scaling: ScalingPolicy
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS
    dead_letter: DeadLetterSpec = field(default_factory=DeadLetterSpec)


def _check(ok: bool, key: str, value: Any, valid: str) -> None:
    if not ok:  # the message reaches the status: a URL pasted in the wrong field keeps its password
        raise InvalidSpec(redact(f"spec.{key}={value!r} is invalid: must be {valid}"))


def _number(spec: Mapping[str, Any], key: str, default: Any, kind: type = int, *, within: str = "") -> Any:
    value = spec.get(key, default)
    if value is None:
        return None
    # finite first: int(inf) is an OverflowError, int(nan) a ValueError (the API server's JSON has
    # neither, but a unit test's or a stored pool's spec may)
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (kind is float or value == int(value)))
    _check(ok, within + key, value, "a whole number" if kind is int else "a finite number")
    return kind(value)


def _object(parent: Mapping[str, Any], key: str, within: str = "") -> Mapping[str, Any]:
    """``parent[key]`` as a mapping ({} when absent): `scaleTargetRef: workers` is a clear error, not an
    AttributeError from ``"workers".get``."""
    value = parent.get(key)
    if value is None:
        return {}
    _check(isinstance(value, Mapping), within + key, value, "an object (a YAML mapping of its fields)")
    return value


def _name(value: Any, key: str, what: str) -> str:
    _check(isinstance(value, str) and len(value) <= 253 and bool(DNS1123_SUBDOMAIN.match(value)), key, value,
           f"the name of a {what}: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)")
    return value


def _secret_key(value: Any, key: str) -> str:
    _check(isinstance(value, str) and len(value) <= 253 and bool(SECRET_KEY.match(value)), key, value,
           "a key of the Secret's data (letters, digits, '-', '_' and '.')")
    return value


def _http_url(value: Any, key: str) -> str | None:
    if value is None:
        return None
    valid = "an http:// or https:// URL with a host and no spaces"
    _check(isinstance(value, str) and not any(c.isspace() for c in value), key, value, valid)
    try:
        parts = urlsplit(value)
        parts.port  # ':abc' or ':99999' raise here, else in the HTTP client at the first page
    except ValueError as exc:  # also 'http://[::1' (an unclosed IPv6 host)
        _check(False, key, value, f"{valid} ({exc}; a port is 1..65535)")
    _check(parts.scheme in ("http", "https") and bool(parts.hostname), key, value, valid)
    return value


def _target(spec: Mapping[str, Any]) -> ScaleTargetRef:
    target = _object(spec, "scaleTargetRef")
    api_version, kind = target.get("apiVersion", "apps/v1"), target.get("kind", "Deployment")
    _check(isinstance(api_version, str) and bool(API_VERSION.match(api_version)), "scaleTargetRef.apiVersion",
           api_version, "group/version of an API, e.g. apps/v1")
    _check(isinstance(kind, str) and bool(KIND.match(kind)), "scaleTargetRef.kind", kind,
           "a Kind with a scale subresource, e.g. Deployment or StatefulSet")
    return ScaleTargetRef(api_version=api_version, kind=kind,
                          name=_name(target.get("name"), "scaleTargetRef.name", kind))


def _broker(spec: Mapping[str, Any]) -> BrokerSpec:
    broker = _object(spec, "broker")
    kind = broker.get("type")
    _check(kind in BROKER_TYPES, "broker.type", kind, f"one of {', '.join(BROKER_TYPES)}")
    secret = _object(broker, "secretRef", "broker.")
    management_key = secret.get("managementUrlKey")
    _check(management_key is None or kind == "rabbitmq", "broker.secretRef.managementUrlKey", management_key,
           "unset for a redis broker (it names the RabbitMQ management API URL)")
    prefix = broker.get("globalKeyprefix", "")
    _check(isinstance(prefix, str), "broker.globalKeyprefix", prefix, "a string, e.g. 'shop:'")
    _check(not prefix or kind == "redis", "broker.globalKeyprefix", prefix,
           "unset for a rabbitmq broker (it is kombu's Redis key prefix)")
    queues = broker.get("queues") or []
    _check(isinstance(queues, list) and len(queues) > 0 and all(isinstance(q, str) and q for q in queues),
           "broker.queues", queues, "a non-empty list of queue names")
    explicit = broker.get("deadLetterQueues")
    # a bare string would be read letter by letter ("names 6 dead-letter queues"), numbers kept as queue names
    _check(explicit is None or (isinstance(explicit, list) and all(isinstance(q, str) and q for q in explicit)),
           "broker.deadLetterQueues", explicit, "a list of dead-letter queue names, one per queue")
    try:
        dead_letter_queues = contract.dead_letter_queues(
            queues, explicit, source="spec.broker.deadLetterQueues" if explicit else "spec.broker.queues")
    except contract.ContractError as exc:
        raise InvalidSpec(str(exc)) from exc
    return BrokerSpec(
        type=kind,
        secret_name=_name(secret.get("name"), "broker.secretRef.name", "Secret"),
        secret_key=_secret_key(secret.get("key", "url"), "broker.secretRef.key"),
        management_url_key=None if management_key is None
        else _secret_key(management_key, "broker.secretRef.managementUrlKey"),
        queues=tuple(queues),
        dead_letter_queues=tuple(dead_letter_queues.values()),
        global_keyprefix=prefix,
    )


def _dead_letter(spec: Mapping[str, Any]) -> DeadLetterSpec:
    dl = _object(spec, "deadLetter")
    alertmanager = _http_url(dl.get("alertmanagerUrl"), "deadLetter.alertmanagerUrl")
    webhook = _http_url(dl.get("webhookUrl"), "deadLetter.webhookUrl")
    _check(not (alertmanager and webhook), "deadLetter.webhookUrl", webhook,
           "unset when deadLetter.alertmanagerUrl is set (one page target per pool)")
    _check(alertmanager is None or not (urlsplit(alertmanager).query or urlsplit(alertmanager).fragment),
           "deadLetter.alertmanagerUrl", alertmanager, "a base URL without ?query or #fragment (/api/v2/alerts is added)")
    severity = dl.get("severity", DEFAULT_SEVERITY)
    _check(severity in SEVERITIES, "deadLetter.severity", severity, f"one of {', '.join(SEVERITIES)}")
    result = DeadLetterSpec(
        threshold=_number(dl, "threshold", DEFAULT_DEAD_LETTER_THRESHOLD, within="deadLetter."),
        alertmanager_url=alertmanager, webhook_url=webhook, severity=severity,
        resend_interval_seconds=_number(dl, "resendIntervalSeconds", DEFAULT_RESEND_INTERVAL_SECONDS, float,
                                        within="deadLetter."),
    )
    _check(result.threshold >= 1, "deadLetter.threshold", result.threshold, ">= 1")
    _check(result.resend_interval_seconds > 0, "deadLetter.resendIntervalSeconds",
           result.resend_interval_seconds, "> 0")
    return result


def parse_spec(spec: Mapping[str, Any]) -> PoolSpec:
    """The typed spec; raises InvalidSpec naming the first offending key."""
    poll = _number(spec, "pollIntervalSeconds", DEFAULT_POLL_INTERVAL_SECONDS, float)
    _check(poll > 0, "pollIntervalSeconds", poll, "> 0")
    return PoolSpec(
        target=_target(spec),
        broker=_broker(spec),
        scaling=ScalingPolicy(
            min_replicas=_number(spec, "minReplicas", 0),
            max_replicas=_number(spec, "maxReplicas", 1),
            target_depth_per_worker=_number(spec, "targetDepthPerWorker", 5),
            max_oldest_message_age_seconds=_number(spec, "maxOldestMessageAgeSeconds", None, float),
            scale_down_stabilization_seconds=_number(spec, "scaleDownStabilizationSeconds",
                                                     DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS, float),
        ),
        poll_interval_seconds=poll,
        dead_letter=_dead_letter(spec),
    )


_parsed_specs: dict[str, PoolSpec] = {}


def parse_spec_cached(spec: Mapping[str, Any]) -> PoolSpec:
    """`parse_spec`, once per distinct spec. A poll parses its pool's spec every time, and the spec
    seldom changes: parsing is pure and a PoolSpec immutable, so an identical spec's parse is reused
    (a seventh of a poll's CPU in bench/operator_scale.py). An invalid spec is not kept: it raises
    on every poll, as parse_spec does."""
    key = repr(spec)  # JSON values, from the API: equal text is an equal spec (1, 1.0 and True differ)
    parsed = _parsed_specs.get(key)
    if parsed is None:
        parsed = parse_spec(spec)
        if len(_parsed_specs) >= MAX_PARSED_SPECS:  # the oldest first: edited specs leave theirs behind
            del _parsed_specs[next(iter(_parsed_specs))]
        _parsed_specs[key] = parsed
    return parsed
