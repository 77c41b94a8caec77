"""The status a poll writes, once its plan was applied (pure).

`settle()` folds the `Outcome` of the apply step into the conditions decided by `plan()`: whether
the rescale went through, which pages were delivered, and the Ready condition, whose reason is the
one word of the Status column of `kubectl get wp`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from .alerts import rfc3339
from .paging import PagingState
from .plan import EventSpec, Outcome, Plan, PoolMemory, Snapshot, warnings
from .scaling import Decision
from .status import Conditions


def settle(snapshot: Snapshot, planned: Plan, outcome: Outcome) -> tuple[dict[str, Any], PoolMemory, list[EventSpec]]:
    """The status to write, the memory to keep and the Events that what was applied calls for."""
    conditions, memory, status = planned.conditions, planned.memory, dict(planned.status)
    spec, now = snapshot.spec, snapshot.now
    if spec is None:
        status["conditions"] = conditions.as_list()
        return status, memory, []
    events: list[EventSpec] = []
    decision, pause = planned.decision, snapshot.pause
    if decision is not None:
        if outcome.scale_error:
            conditions.set("ScalingActive", False, "FailedRescale", outcome.scale_error)
            events += warnings(conditions, "ScalingActive")
        elif pause is not None:
            conditions.set("ScalingActive", False, pause.reason, pause.message)
            if conditions.newly("ScalingActive", "False"):
                events.append(EventSpec("Normal" if pause.reason == "Paused" else "Warning", pause.reason,
                                        pause.message))
        else:
            if conditions.get("ScalingActive").get("reason") in ("Paused", "InvalidPauseAnnotation"):
                events.append(EventSpec("Normal", "Resumed", "autoscaling resumed: the pause annotation is gone"))
            conditions.set("ScalingActive", True, "Decided", decision.reason)
    if outcome.scaled and planned.scale is not None:
        memory = replace(memory, last_scale_time=rfc3339(now), last_scale_reason=planned.scale.describe())
        events.append(planned.scale.event())
    paging = memory.paging or PagingState()
    for queue in outcome.undelivered:
        paging = paging.unsent(queue)
    if paging != memory.paging:
        memory = replace(memory, paging=paging)

    threshold = spec.dead_letter.threshold
    if paging.firing:
        undelivered = "; ".join(outcome.undelivered.values())
        conditions.set("DeadLetterAlert", True, "PageNotDelivered" if undelivered else "ThresholdExceeded",
                       "; ".join(f"{q}: {f.depth} >= {threshold}" for q, f in sorted(paging.firing.items()))
                       + (f"; {undelivered}" if undelivered else ""))
    else:
        conditions.set("DeadLetterAlert", False, "BelowThreshold",
                       f"every dead-letter queue holds fewer than {threshold} messages")
    _set_ready(conditions, snapshot, decision)

    previous = snapshot.previous_status
    new_alert = paging.to_status()
    status["deadLetterAlert"] = {**{q: None for q in previous.get("deadLetterAlert") or {} if q not in new_alert},
                                 **new_alert}
    status.setdefault("busyWorkers", previous.get("busyWorkers"))
    status.update(
        lastScaleTime=memory.last_scale_time, lastScaleReason=memory.last_scale_reason,
        lastDecisionReason=decision.reason if decision else previous.get("lastDecisionReason"),
        recentTerminations=memory.terminations, conditions=conditions.as_list())
    return status, memory, events


def _set_ready(conditions: Conditions, snapshot: Snapshot, decision: Decision | None) -> None:
    """Ready says whether the operator can act on the pool; its reason is the one word of the
    Status column (kubectl get wp), its message the sentence behind it."""
    for blocking in ("BrokerReachable", "ScaleTargetFound", "ScalingActive"):
        condition = conditions.get(blocking)
        if condition.get("status") == "False" and condition.get("reason") not in ("Paused", "InvalidPauseAnnotation"):
            conditions.set("Ready", False, condition["reason"], condition["message"])
            return
    scale, observation = snapshot.scale, snapshot.observation
    if snapshot.pause is not None:
        reason, message = "Paused", snapshot.pause.message
    elif conditions.is_true("DeadLetterAlert"):
        reason, message = "DeadLetterAlert", conditions.get("DeadLetterAlert")["message"]
    elif decision is not None and decision.replicas != scale.replicas:
        reason = "ScalingUp" if decision.replicas > scale.replicas else "ScalingDown"
        message = f"{scale.replicas} -> {decision.replicas}: {decision.reason}"
    elif decision is not None and decision.replicas == 0 and observation is not None and observation.depth == 0:
        reason, message = "Idle", "no message waits and no worker runs"
    else:
        reason, message = "Active", decision.reason if decision else "observing"
    conditions.set("Ready", True, reason, message)


def status_changed(previous: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    for key, value in status.items():
        if key == "deadLetterAlert":
            if {k: v for k, v in (value or {}).items() if v is not None} != (previous.get(key) or {}):
                return True
        elif previous.get(key) != value:
            return True
    return False
