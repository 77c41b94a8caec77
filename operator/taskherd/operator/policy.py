"""A WorkerPool's spec read once into typed values, with the defaults documented in one place.

The API server already refuses bad specs (OpenAPI schema + CEL rules in the CRD); this module
checks the same rules (fields, types, ranges, formats, exclusive and broker-specific fields, the
dead-letter queues), so that a pool stored before the CRD was tightened, or a spec built by hand,
fails with a clear message naming the key and the valid range instead of a confusing decision (or
a TypeError) later. The corpus of bad pools in tests/operator runs through both, and
tests/operator/test_workerpool_agreement.py compares RANGES, FIELDS and the queue rules with the
CRD and the chart's values.schema.json, so the three cannot drift.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from taskherd import contract


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

#: Every integer field and its range (minimum, maximum), as in the CRD's schema.
RANGES: dict[str, tuple[int, int]] = {
    "minReplicas": (0, 1000),
    "maxReplicas": (1, 1000),
    "targetDepthPerWorker": (1, 100_000),
    "maxOldestMessageAgeSeconds": (1, 86_400),
    "pollIntervalSeconds": (1, 300),
    "scaleDownStabilizationSeconds": (0, 3600),
    "deadLetter.threshold": (1, 1_000_000),
    "deadLetter.resendIntervalSeconds": (10, 600),
}
#: The fields of a spec and of each object in it, as in the CRD's schema: any other key is a typo
#: (the API server prunes or refuses it; a spec built by hand would silently get the default).
FIELDS: dict[str, tuple[str, ...]] = {
    "": ("scaleTargetRef", "broker", "minReplicas", "maxReplicas", "targetDepthPerWorker",
         "maxOldestMessageAgeSeconds", "pollIntervalSeconds", "scaleDownStabilizationSeconds", "deadLetter"),
    "scaleTargetRef": ("apiVersion", "kind", "name"),
    "broker": ("type", "secretRef", "queues", "deadLetterQueues", "globalKeyprefix"),
    "broker.secretRef": ("name", "key", "managementUrlKey"),
    "deadLetter": ("threshold", "alertmanagerUrl", "webhookUrl", "severity", "resendIntervalSeconds"),
}
#: Queues per pool, and UTF-8 bytes per queue name: RabbitMQ's limit is 255 bytes, and a name over
#: it is refused by the broker while its management API answers 404 (read as an empty queue). The
#: CRD says the same with size(bytes(q)) (its maxLength counts characters: "é" is two bytes).
MAX_QUEUES = 64
MAX_QUEUE_NAME_LENGTH = 255
#: The default dead-letter queue <queue>.dlq must fit too: a queue named without one is this short.
MAX_QUEUE_NAME_LENGTH_WITH_DEFAULT_DLQ = MAX_QUEUE_NAME_LENGTH - len(".dlq")

# The formats the CRD's CEL rules check, in the same words. Each is matched whole (fullmatch): with
# re.match, '$' also matches before a final newline, and "emails\n" would pass as "emails".
#: an object name (Deployment, Secret, ...): a DNS-1123 subdomain.
#: (at most 253 characters: contract's pattern says so)
DNS1123_SUBDOMAIN = re.compile(contract.SUBDOMAIN)
#: a key of a Secret's data.
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
#: a Kind: CamelCase, as in Deployment or StatefulSet.
KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
#: group/version of an API with a scale subresource (core v1 has none worth scaling here).
API_VERSION = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/v[0-9]+((alpha|beta)[0-9]+)?$")
#: a queue name: the CRD's (and the chart's) ^[^,\s\p{Z}\p{Cc}]+$ in Python's words (its \s already
#: covers \p{Z}); no commas, since the chart and the contract join queue names with them.
QUEUE_NAME = re.compile(r"^[^,\s\x00-\x1f\x7f-\x9f]+$")
QUEUE_NAME_VALID = "a queue name without commas, whitespace or control characters"
#: invisible format characters (Unicode category Cf: U+200B zero-width space, U+FEFF, U+00AD soft
#: hyphen, ...): a queue name holding one looks like another queue's. The CRD refuses \p{Cf} too.
FORMAT_CHARACTER_VALID = "no invisible format characters (Unicode category Cf, e.g. U+200B, U+FEFF, U+00AD)"
#: a value is shown in a message at most this long (its repr), so that "must be …" always fits in a
#: condition's message (status.MESSAGE_LIMIT, 1000 characters).
MAX_SHOWN = 120
#: a port in a URL: 1..65535, digits only; URLs are judged by contract.http_url_problem.
PORT = re.compile(contract.PORT)
MAX_URL_LENGTH = contract.MAX_URL_LENGTH


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
               f"<= spec.maxReplicas ({self.max_replicas})")
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


def _shown(value: Any, limit: int = MAX_SHOWN) -> str:
    return contract.shown(value, limit, redacted=True)  # a URL pasted in the wrong field keeps its password


def _check(ok: bool, key: str, value: Any, valid: str) -> None:
    if not ok:  # the message reaches the status: a URL pasted in the wrong field keeps its password
        where = "spec." + _shown(key, 60)[1:-1] if key else "spec"  # a typo'd key may be long too
        raise InvalidSpec(contract.redact(f"{where}={_shown(value)} is invalid: must be {valid}"))


def _range(key: str) -> str:
    low, high = RANGES[key]
    return f"a whole number from {low} to {high}"


#: the default of a field the CRD requires
REQUIRED = object()


def _integer(spec: Mapping[str, Any], key: str, default: Any, *, within: str = "") -> int | None:
    """``spec[key]`` as an int within RANGES[within + key]; ``default`` when absent. None stands for
    absent only when the default is None (an optional field): anything else would reach a
    comparison as a TypeError."""
    value = spec.get(key, default)
    if value is None and default is None:
        return None
    _check(value is not REQUIRED, within + key, None, f"set (it is required): {_range(within + key)}")
    low, high = RANGES[within + key]
    # finite first: int(inf) is an OverflowError, int(nan) a ValueError (the API server's JSON has
    # neither, but a unit test's or a stored pool's spec may)
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and value == int(value) and low <= value <= high)
    _check(ok, within + key, value, _range(within + key))
    return int(value)


def _unknown_keys(value: Mapping[str, Any], at: str) -> None:
    valid = FIELDS[at]
    for key in value:
        _check(key in valid, f"{at}.{key}" if at else str(key), value[key],
               f"left out, or spelled as one of the fields of spec{'.' + at if at else ''}: {', '.join(valid)}")


def _object(parent: Mapping[str, Any], key: str, within: str = "") -> Mapping[str, Any]:
    """``parent[key]`` as a mapping ({} when absent) with only the CRD's fields: `scaleTargetRef:
    workers` is a clear error, not an AttributeError from ``"workers".get``."""
    value = parent.get(key)
    if value is None:
        return {}
    _check(isinstance(value, Mapping), within + key, value, "an object (a YAML mapping of its fields)")
    _unknown_keys(value, within + key)
    return value


def _name(value: Any, key: str, what: str) -> str:
    _check(isinstance(value, str) and bool(DNS1123_SUBDOMAIN.fullmatch(value)), key, value,
           f"the name of a {what}: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253)")
    return value


def _secret_key(value: Any, key: str) -> str:
    _check(isinstance(value, str) and len(value) <= 253 and bool(SECRET_KEY.fullmatch(value)), key, value,
           "a key of the Secret's data (letters, digits, '-', '_' and '.')")
    return value


def _http_url(value: Any, key: str, *, base: bool) -> str | None:
    if value is None:
        return None
    valid = contract.HTTP_BASE_URL_VALID if base else contract.HTTP_URL_VALID
    _check(isinstance(value, str), key, value, valid)
    problem = contract.http_url_problem(value, base=base)
    _check(problem is None, key, value, f"{valid}; here: {problem}")
    return value


def _target(spec: Mapping[str, Any]) -> ScaleTargetRef:
    target = _object(spec, "scaleTargetRef")
    api_version, kind = target.get("apiVersion", "apps/v1"), target.get("kind", "Deployment")
    _check(isinstance(api_version, str) and bool(API_VERSION.fullmatch(api_version)), "scaleTargetRef.apiVersion",
           api_version, "group/version of an API, e.g. apps/v1")
    _check(isinstance(kind, str) and bool(KIND.fullmatch(kind)), "scaleTargetRef.kind", kind,
           "a Kind with a scale subresource, e.g. Deployment or StatefulSet")
    return ScaleTargetRef(api_version=api_version, kind=kind,
                          name=_name(target.get("name"), "scaleTargetRef.name", kind))


def _utf8_length(name: str) -> int:
    """Bytes of ``name`` as the broker stores it (a lone surrogate, which JSON cannot carry, as one
    replacement character: its length only has to be refused or not, the name is refused anyway)."""
    return len(name.encode("utf-8", "replace"))


def _queue_names(names: Any, key: str, how_many: str) -> None:
    """A list of distinct queue names, as the CRD's list-type set of bounded strings."""
    valid = (f"{how_many} {MAX_QUEUES} distinct names, each {QUEUE_NAME_VALID}, "
             f"at most {MAX_QUEUE_NAME_LENGTH} bytes in UTF-8")
    _check(isinstance(names, list) and len(names) <= MAX_QUEUES, key, names, valid)
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        _check(isinstance(name, str) and bool(QUEUE_NAME.fullmatch(name)), f"{key}[{i}]", name, valid)
        length = _utf8_length(name)
        _check(length <= MAX_QUEUE_NAME_LENGTH, f"{key}[{i}]", name,
               f"{valid}; here: {length} bytes ({len(name)} characters)")
        invisible = contract.format_character(name)
        _check(invisible is None, f"{key}[{i}]", name, f"{valid}, {FORMAT_CHARACTER_VALID}; here: {invisible}")
        # the first repeat by index, as the API server says it (spec.broker.queues[3]: Duplicate value)
        _check(name not in seen, f"{key}[{i}]", name, f"{valid}; it repeats spec.{key}[{seen.get(name)}]")
        seen[name] = i


def _broker(spec: Mapping[str, Any]) -> BrokerSpec:
    broker = _object(spec, "broker")
    kind = broker.get("type")
    _check(kind in BROKER_TYPES, "broker.type", kind, f"one of {', '.join(BROKER_TYPES)}")
    secret = _object(broker, "secretRef", "broker.")
    management_key = secret.get("managementUrlKey")
    _check(management_key is None or kind == "rabbitmq", "broker.secretRef.managementUrlKey", management_key,
           "unset for a redis broker (it names the RabbitMQ management API URL)")
    prefix = broker.get("globalKeyprefix", "")
    _check(isinstance(prefix, str) and len(prefix) <= MAX_QUEUE_NAME_LENGTH, "broker.globalKeyprefix", prefix,
           f"a string of at most {MAX_QUEUE_NAME_LENGTH} characters, e.g. 'shop:'")
    _check(not prefix or kind == "redis", "broker.globalKeyprefix", prefix,
           "unset for a rabbitmq broker (it is kombu's Redis key prefix)")
    queues = broker.get("queues")
    queues = [] if queues is None else queues
    _queue_names(queues, "broker.queues", "a list of 1 to")
    _check(len(queues) > 0, "broker.queues", queues, f"a list of 1 to {MAX_QUEUES} queue names")
    explicit = broker.get("deadLetterQueues")
    # a bare string would be read letter by letter ("names 6 dead-letter queues"), numbers kept as queue names
    _queue_names([] if explicit is None else explicit, "broker.deadLetterQueues", "one per queue, at most")
    if not explicit:  # each queue gets <queue>.dlq: that name must fit as well
        for i, queue in enumerate(queues):
            length = _utf8_length(queue)
            _check(length <= MAX_QUEUE_NAME_LENGTH_WITH_DEFAULT_DLQ, f"broker.queues[{i}]", queue,
                   f"a name of at most {MAX_QUEUE_NAME_LENGTH_WITH_DEFAULT_DLQ} bytes in UTF-8, so that its "
                   f"dead-letter queue <queue>.dlq fits in {MAX_QUEUE_NAME_LENGTH}; or name the dead-letter "
                   f"queues in spec.broker.deadLetterQueues; here: {length} bytes")
    # the CRD's rules, by index; contract.dead_letter_queues below would print every queue name before
    # what is valid (64 names of 255 bytes: past a condition's 1000 characters)
    if explicit:
        _check(len(explicit) == len(queues), "broker.deadLetterQueues", explicit,
               f"one dead-letter queue per queue of spec.broker.queues, in the same order (here {len(explicit)} "
               f"for {len(queues)} queues), or left out for <queue>.dlq")
        for i, dlq in enumerate(explicit):
            _check(dlq not in queues, f"broker.deadLetterQueues[{i}]", dlq,
                   f"not a work queue of spec.broker.queues (a dead-letter queue is never consumed as work); "
                   f"here: it is spec.broker.queues[{queues.index(dlq) if dlq in queues else -1}]")
    else:
        for i, queue in enumerate(queues):
            dlq = f"{queue}.dlq"
            _check(dlq not in queues, f"broker.queues[{queues.index(dlq) if dlq in queues else -1}]", dlq,
                   f"not the default dead-letter queue <queue>.dlq of spec.broker.queues[{i}]={_shown(queue)} "
                   "(a dead-letter queue is never consumed as work): name other dead-letter queues in "
                   "spec.broker.deadLetterQueues")
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
    alertmanager = _http_url(dl.get("alertmanagerUrl"), "deadLetter.alertmanagerUrl", base=True)
    webhook = _http_url(dl.get("webhookUrl"), "deadLetter.webhookUrl", base=False)
    _check(not (alertmanager and webhook), "deadLetter.webhookUrl", webhook,
           "unset when spec.deadLetter.alertmanagerUrl is set (one page target per pool)")
    severity = dl.get("severity", DEFAULT_SEVERITY)
    _check(severity in SEVERITIES, "deadLetter.severity", severity, f"one of {', '.join(SEVERITIES)}")
    return DeadLetterSpec(
        threshold=_integer(dl, "threshold", DEFAULT_DEAD_LETTER_THRESHOLD, within="deadLetter."),
        alertmanager_url=alertmanager, webhook_url=webhook, severity=severity,
        resend_interval_seconds=float(_integer(dl, "resendIntervalSeconds", int(DEFAULT_RESEND_INTERVAL_SECONDS),
                                               within="deadLetter.")),
    )


def parse_spec(spec: Mapping[str, Any]) -> PoolSpec:
    """The typed spec; raises InvalidSpec naming the first offending key."""
    _check(isinstance(spec, Mapping), "", spec, "an object (a YAML mapping of its fields)")
    _unknown_keys(spec, "")
    age_limit = _integer(spec, "maxOldestMessageAgeSeconds", None)
    return PoolSpec(
        target=_target(spec),
        broker=_broker(spec),
        scaling=ScalingPolicy(
            min_replicas=_integer(spec, "minReplicas", 0),
            max_replicas=_integer(spec, "maxReplicas", REQUIRED),
            target_depth_per_worker=_integer(spec, "targetDepthPerWorker", 5),
            max_oldest_message_age_seconds=None if age_limit is None else float(age_limit),
            scale_down_stabilization_seconds=float(_integer(spec, "scaleDownStabilizationSeconds",
                                                            int(DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS))),
        ),
        poll_interval_seconds=float(_integer(spec, "pollIntervalSeconds", int(DEFAULT_POLL_INTERVAL_SECONDS))),
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
