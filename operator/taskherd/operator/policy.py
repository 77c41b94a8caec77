"""A WorkerPool's spec read once into typed values, with the defaults documented in one place.

The API server already rejects bad specs (OpenAPI schema + CEL rules in the CRD); this module
re-checks the same rules so that a pool created before the CRD was tightened, or a unit test,
fails with the same clear message instead of a confusing decision later.
"""
from __future__ import annotations

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
    deployment: str
    broker: BrokerSpec
    scaling: ScalingPolicy
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS
    dead_letter: DeadLetterSpec = field(default_factory=DeadLetterSpec)


def _check(ok: bool, key: str, value: Any, valid: str) -> None:
    if not ok:
        raise InvalidSpec(f"spec.{key}={value!r} is invalid: must be {valid}")


def parse_spec(spec: Mapping[str, Any]) -> PoolSpec:
    """The typed spec; raises InvalidSpec naming the first offending key."""
    target = spec.get("scaleTargetRef") or {}
    _check(target.get("kind", "Deployment") == "Deployment", "scaleTargetRef.kind", target.get("kind"), "Deployment")
    _check(bool(target.get("name")), "scaleTargetRef.name", target.get("name"), "a Deployment name")
    broker = spec.get("broker") or {}
    _check(broker.get("type") in BROKER_TYPES, "broker.type", broker.get("type"), f"one of {BROKER_TYPES}")
    secret = broker.get("secretRef") or {}
    _check(bool(secret.get("name")), "broker.secretRef.name", secret.get("name"), "a Secret name")
    queues = tuple(broker.get("queues") or ())
    _check(len(queues) > 0, "broker.queues", list(queues), "a non-empty list of queue names")
    try:
        dlqs = tuple(contract.dead_letter_queues(queues, broker.get("deadLetterQueues"),
                                                 source="spec.broker.deadLetterQueues").values())
    except contract.ContractError as exc:
        raise InvalidSpec(str(exc)) from exc
    dl = spec.get("deadLetter") or {}
    dead_letter = DeadLetterSpec(
        threshold=int(dl.get("threshold", DEFAULT_DEAD_LETTER_THRESHOLD)),
        alertmanager_url=dl.get("alertmanagerUrl"),
        webhook_url=dl.get("webhookUrl"),
        severity=dl.get("severity", DEFAULT_SEVERITY),
        resend_interval_seconds=float(dl.get("resendIntervalSeconds", DEFAULT_RESEND_INTERVAL_SECONDS)),
    )
    _check(dead_letter.threshold >= 1, "deadLetter.threshold", dead_letter.threshold, ">= 1")
    _check(dead_letter.resend_interval_seconds > 0, "deadLetter.resendIntervalSeconds",
           dead_letter.resend_interval_seconds, "> 0")
    poll = float(spec.get("pollIntervalSeconds", DEFAULT_POLL_INTERVAL_SECONDS))
    _check(poll > 0, "pollIntervalSeconds", poll, "> 0")
    age = spec.get("maxOldestMessageAgeSeconds")
    return PoolSpec(
        deployment=target["name"],
        broker=BrokerSpec(
            type=broker["type"],
            secret_name=secret["name"],
            secret_key=secret.get("key", "url"),
            management_url_key=secret.get("managementUrlKey"),
            queues=queues,
            dead_letter_queues=dlqs,
            global_keyprefix=broker.get("globalKeyprefix", ""),
        ),
        scaling=ScalingPolicy(
            min_replicas=int(spec.get("minReplicas", 0)),
            max_replicas=int(spec.get("maxReplicas", 1)),
            target_depth_per_worker=int(spec.get("targetDepthPerWorker", 5)),
            max_oldest_message_age_seconds=None if age is None else float(age),
            scale_down_stabilization_seconds=float(
                spec.get("scaleDownStabilizationSeconds", DEFAULT_SCALE_DOWN_STABILIZATION_SECONDS)),
        ),
        poll_interval_seconds=poll,
        dead_letter=dead_letter,
    )
