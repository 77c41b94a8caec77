"""Whether a component's StatefulSet has rolled out and is ready, and a one-line account of it: a
pure function of the StatefulSet and its pods as the API returns them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Rollout:
    component: str
    done: bool
    summary: str  #: e.g. "1/1 ready", "0/3 ready: rabbitmq-1 CrashLoopBackOff (restarts 2)"


def _pod_state(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "terminating"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        restarts = container.get("restartCount", 0)
        suffix = f" (restarts {restarts})" if restarts else ""
        if waiting:
            return f"{waiting.get('reason', 'waiting')}{suffix}"
        if not container.get("ready"):
            return f"running, not ready{suffix}"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"unschedulable: {condition.get('message', '')[:120]}"
    return status.get("phase", "unknown")


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) \
        and not pod.get("metadata", {}).get("deletionTimestamp")


def rollout_of(component: str, statefulset: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> Rollout:
    if statefulset is None:
        return Rollout(component, False, "no StatefulSet yet")
    spec, status = statefulset.get("spec") or {}, statefulset.get("status") or {}
    want = spec.get("replicas", 1)
    revision = status.get("updateRevision")
    current = [p for p in pods if p["metadata"].get("labels", {}).get("controller-revision-hash") == revision]
    ready = [p for p in current if _ready(p)]
    observed = status.get("observedGeneration", 0) >= statefulset["metadata"].get("generation", 0)
    done = observed and len(ready) == want and len(pods) == want
    summary = f"{len(ready)}/{want} ready"
    if not done:
        others = sorted((p for p in pods if p not in ready), key=lambda p: p["metadata"]["name"])
        details = [f"{p['metadata']['name']} "
                   f"{'old revision, ' if p not in current else ''}{_pod_state(p)}" for p in others]
        if details:
            summary += ": " + ", ".join(details)
        elif not observed:
            summary += ": the controller has not seen the new spec yet"
    return Rollout(component, done, summary)
