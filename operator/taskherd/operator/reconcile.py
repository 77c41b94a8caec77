"""One poll of one WorkerPool: observe, decide, apply, page, report. The thin imperative shell
around the pure modules (scaling, deletion_cost, paging, terminations); every side effect goes
through an injected dependency so the whole cycle runs in tests against in-memory fakes.

Failures never escape as exceptions: an unreachable broker, a missing Deployment or a failed
page becomes a status condition with the error, and the next poll tries again.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .alerts import Poster, deliver, rfc3339
from .busyness import BusynessReader, read_busyness
from .deletion_cost import ANNOTATION, annotations_to_change, busy_count, deletion_costs
from .kube import Kube, NotFound
from .metrics import OperatorMetrics
from .observe import ObserveFn, redact
from .paging import PagingState, step
from .policy import InvalidSpec, PoolSpec, parse_spec
from .scaling import Observation, Recommendation, desired_replicas, prune_history
from .terminations import recent_terminations

log = logging.getLogger("taskherd.operator")

#: pods and their Events are read for the termination report at most this often.
TERMINATIONS_EVERY_SECONDS = 30.0


@dataclass
class PoolMemory:
    """What one pool's poll loop keeps between polls (lost on restart, on purpose: a new leader
    first watches a whole stabilisation window before scaling down)."""

    history: list[Recommendation] = field(default_factory=list)
    paging: PagingState | None = None  # None: not yet loaded from the status
    last_scale_time: str | None = None
    last_scale_reason: str | None = None
    terminations: list[dict[str, Any]] = field(default_factory=list)
    terminations_read_at: float = -math.inf


@dataclass(kw_only=True)
class Deps:
    kube: Kube
    observe: ObserveFn
    busyness: BusynessReader
    poster: Poster
    metrics: OperatorMetrics
    clock: Callable[[], float] = time.time
    #: used when a pool's spec names no alert target.
    default_alertmanager_url: str | None = None


class Conditions:
    """Status conditions that keep lastTransitionTime when nothing changed."""

    def __init__(self, previous: list[Mapping[str, Any]] | None, now: float) -> None:
        self._items = {c["type"]: dict(c) for c in previous or [] if "type" in c}
        self._now = rfc3339(now)
        #: what changed in this poll, for the log.
        self.transitions: list[str] = []

    def set(self, type_: str, ok: bool, reason: str, message: str) -> None:
        status = "True" if ok else "False"
        old = self._items.get(type_, {})
        if old.get("status") != status or old.get("reason") != reason:
            self.transitions.append(f"{type_}={status} ({reason}: {message[:200]})")
        since = old.get("lastTransitionTime") if old.get("status") == status else self._now
        self._items[type_] = {"type": type_, "status": status, "reason": reason, "message": message[:1000],
                              "lastTransitionTime": since or self._now}

    def is_true(self, type_: str) -> bool:
        return self._items.get(type_, {}).get("status") == "True"

    def as_list(self) -> list[dict[str, Any]]:
        return [self._items[k] for k in sorted(self._items)]


def _phase(conditions: Conditions, *, desired: int | None, current: int | None, observation: Observation | None) -> str:
    if not conditions.is_true("ScaleTargetFound"):
        return "ScaleTargetMissing"
    if not conditions.is_true("BrokerReachable"):
        return "BrokerUnreachable"
    if conditions.is_true("DeadLetterAlert"):
        return "DeadLetterAlert"
    if desired is not None and current is not None and desired != current:
        return "ScalingUp" if desired > current else "ScalingDown"
    if desired == 0 and observation is not None and observation.depth == 0:
        return "Idle"
    return "Active"


async def _apply_scale(spec: PoolSpec, namespace: str, current: int, selector: str,
                       observation: Observation | None, memory: PoolMemory, deps: Deps, now: float):
    """Decide and apply; returns (decision, busy workers or None when not read)."""
    policy = spec.scaling
    decision = desired_replicas(policy, observation, current, 0, memory.history, now)
    busy = None
    if decision.replicas < current:
        # Busyness matters only for a scale-down: read it then, and decide again with it.
        pods = await deps.kube.list_pods(namespace, selector)
        pods_busyness = await read_busyness(pods, deps.busyness)
        busy = busy_count(pods_busyness)
        decision = desired_replicas(policy, observation, current, busy, memory.history, now)
        if decision.replicas < current:
            present = {p["metadata"]["name"]: ((p["metadata"].get("annotations") or {}).get(ANNOTATION))
                       for p in pods}
            for pod, cost in annotations_to_change(deletion_costs(pods_busyness), present).items():
                await deps.kube.annotate_pod(namespace, pod, ANNOTATION, str(cost))
    if decision.recommendation is not None:
        memory.history = prune_history(memory.history + [decision.recommendation], now,
                                       policy.scale_down_stabilization_seconds)
    if decision.replicas != current:
        await deps.kube.set_scale(namespace, spec.deployment, decision.replicas)
        memory.last_scale_time = rfc3339(now)
        memory.last_scale_reason = f"{current} -> {decision.replicas}: {decision.reason}"
    direction = "up" if decision.replicas > current else "down" if decision.replicas < current else "hold"
    deps.metrics.decisions.labels(direction).inc()
    return decision, busy


async def _page(spec: PoolSpec, body: Mapping[str, Any], observation: Observation | None, memory: PoolMemory,
                deps: Deps, now: float) -> str | None:
    """Runs the paging state machine; returns an error text when a page could not be delivered."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    dl = spec.dead_letter
    state, pages = step(memory.paging or PagingState(), None if observation is None else observation.dead_letters,
                        threshold=dl.threshold, resend_interval=dl.resend_interval_seconds, now=now)
    alertmanager = dl.alertmanager_url or (None if dl.webhook_url else deps.default_alertmanager_url)
    error = None
    for page in pages:
        if page.kind == "fire":
            await deps.kube.post_event(namespace, dict(body), type="Warning", reason="DeadLetterThreshold",
                                       message=f"dead-letter queue {page.queue} holds {page.depth} messages "
                                               f"(threshold {dl.threshold})")
        elif page.kind == "resolve":
            await deps.kube.post_event(namespace, dict(body), type="Normal", reason="DeadLetterResolved",
                                       message=f"dead-letter queue {page.queue} is below the threshold "
                                               f"({page.depth} < {dl.threshold})")
        if not (alertmanager or dl.webhook_url):
            continue
        try:
            await deliver(page, alertmanager_url=alertmanager, webhook_url=dl.webhook_url, poster=deps.poster,
                          pool=name, namespace=namespace, severity=dl.severity, threshold=dl.threshold)
            deps.metrics.pages.labels(page.kind).inc()
        except Exception as exc:  # noqa: BLE001 - due again next poll
            deps.metrics.errors.labels("page").inc()
            state = state.unsent(page.queue)
            error = redact(f"page for {page.queue} not delivered: {type(exc).__name__}: {exc}")
            log.warning("%s/%s: %s", namespace, name, error)
    memory.paging = state
    return error


async def poll_once(body: Mapping[str, Any], memory: PoolMemory, deps: Deps) -> dict[str, Any]:
    """One poll; patches the status (only when it changed) and returns it."""
    started = time.perf_counter()
    now = deps.clock()
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    previous = dict(body.get("status") or {})
    conditions = Conditions(previous.get("conditions"), now)
    status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
    try:
        spec = parse_spec(body.get("spec") or {})
    except InvalidSpec as exc:
        deps.metrics.errors.labels("spec").inc()
        conditions.set("Ready", False, "InvalidSpec", str(exc))
        if conditions.transitions:
            log.warning("%s/%s: %s", namespace, name, exc)
        status.update(conditions=conditions.as_list(), phase="InvalidSpec")
        return await _write(namespace, name, previous, status, deps)
    if memory.paging is None:
        memory.paging = PagingState.from_status(previous.get("deadLetterAlert"))
        memory.last_scale_time = previous.get("lastScaleTime")
        memory.last_scale_reason = previous.get("lastScaleReason")
        memory.terminations = list(previous.get("recentTerminations") or [])

    observation: Observation | None = None
    try:
        observation = await deps.observe(namespace, spec.broker)
        conditions.set("BrokerReachable", True, "Observed", f"inspected {len(spec.broker.queues)} queues and "
                                                             f"{len(spec.broker.dead_letter_queues)} dead-letter queues")
    except Exception as exc:  # noqa: BLE001 - a condition, not a crash loop
        deps.metrics.errors.labels("broker").inc()
        conditions.set("BrokerReachable", False, "BrokerUnreachable", redact(str(exc)) or type(exc).__name__)

    decision = busy = current = None
    try:
        current, actual, selector = await deps.kube.get_scale(namespace, spec.deployment)
        conditions.set("ScaleTargetFound", True, "Found", f"Deployment {spec.deployment}")
    except NotFound:
        conditions.set("ScaleTargetFound", False, "NotFound", f"Deployment {namespace}/{spec.deployment} not found")
    except Exception as exc:  # noqa: BLE001 - API errors (403, 5xx, timeouts) are conditions too
        deps.metrics.errors.labels("scale").inc()
        conditions.set("ScaleTargetFound", False, "ReadFailed",
                       f"scale of Deployment {namespace}/{spec.deployment} not read: {type(exc).__name__}: {exc}"[:1000])
    if current is not None:
        try:
            decision, busy = await _apply_scale(spec, namespace, current, selector, observation, memory, deps, now)
            conditions.set("ScalingActive", True, "Decided", decision.reason)
        except Exception as exc:  # noqa: BLE001
            deps.metrics.errors.labels("scale").inc()
            conditions.set("ScalingActive", False, "ScaleFailed", f"{type(exc).__name__}: {exc}")
        status.update(currentReplicas=actual, desiredReplicas=decision.replicas if decision else current)
        if now - memory.terminations_read_at >= TERMINATIONS_EVERY_SECONDS:
            try:
                pods = await deps.kube.list_pods(namespace, selector)
                events = await deps.kube.list_pod_events(namespace)
                memory.terminations = recent_terminations(pods, events, memory.terminations)
                memory.terminations_read_at = now
            except Exception as exc:  # noqa: BLE001 - the report is best effort
                deps.metrics.errors.labels("terminations").inc()
                log.warning("%s/%s: terminations not read: %s", namespace, name, exc)

    page_error = await _page(spec, body, observation, memory, deps, now)
    alerting = memory.paging.firing if memory.paging else {}
    if alerting:
        conditions.set("DeadLetterAlert", True, "ThresholdExceeded" if not page_error else "PageNotDelivered",
                       "; ".join(f"{q}: {f.depth} >= {spec.dead_letter.threshold}" for q, f in sorted(alerting.items()))
                       + (f"; {page_error}" if page_error else ""))
    else:
        conditions.set("DeadLetterAlert", False, "BelowThreshold", f"every dead-letter queue holds fewer than "
                                                                   f"{spec.dead_letter.threshold} messages")
    ready = conditions.is_true("BrokerReachable") and conditions.is_true("ScaleTargetFound")
    conditions.set("Ready", ready, "Polling" if ready else "Degraded",
                   "observing and scaling" if ready else "see BrokerReachable and ScaleTargetFound")

    if observation is not None:
        status.update(
            observedDepth=observation.depth, readyMessages=observation.ready, unackedMessages=observation.unacked,
            oldestMessageAgeSeconds=None if observation.oldest_message_age_seconds is None
            else int(observation.oldest_message_age_seconds),
            deadLetterDepth=observation.dead_letter_depth, deadLetterQueues=dict(observation.dead_letters))
    new_alert = memory.paging.to_status() if memory.paging else {}
    status["deadLetterAlert"] = {**{q: None for q in previous.get("deadLetterAlert") or {} if q not in new_alert},
                                 **new_alert}
    status.update(
        busyWorkers=busy if busy is not None else previous.get("busyWorkers"),
        lastScaleTime=memory.last_scale_time, lastScaleReason=memory.last_scale_reason,
        lastDecisionReason=decision.reason if decision else previous.get("lastDecisionReason"),
        recentTerminations=memory.terminations, conditions=conditions.as_list(),
        phase=_phase(conditions, desired=decision.replicas if decision else None, current=current,
                     observation=observation))
    written = await _write(namespace, name, previous, status, deps)
    deps.metrics.poll_seconds.observe(time.perf_counter() - started)
    if decision is not None and current is not None and decision.replicas != current:
        log.info("%s/%s: scaled %s", namespace, name, memory.last_scale_reason)
    if conditions.transitions:
        log.info("%s/%s: %s", namespace, name, "; ".join(conditions.transitions))
    return written


def _changed(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    for key, value in status.items():
        if key == "deadLetterAlert":
            if {k: v for k, v in (value or {}).items() if v is not None} != (previous.get(key) or {}):
                return True
        elif previous.get(key) != value:
            return True
    return False


async def _write(namespace: str, name: str, previous: Mapping[str, Any], status: dict[str, Any], deps: Deps):
    if _changed(previous, status):
        try:
            await deps.kube.patch_pool_status(namespace, name, status)
        except Exception as exc:  # noqa: BLE001
            deps.metrics.errors.labels("status").inc()
            log.warning("%s/%s: status not written: %s", namespace, name, exc)
    return status
