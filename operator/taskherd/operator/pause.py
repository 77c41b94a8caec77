"""Pausing a pool's autoscaling with an annotation, as KEDA users do with a ScaledObject (pure).

- `taskherd.io/paused-replicas: "N"` (KEDA's `autoscaling.keda.sh/paused-replicas`): scale the
  target to exactly N (minReplicas/maxReplicas do not apply) and hold it there;
- `taskherd.io/paused: "true"` (KEDA's `autoscaling.keda.sh/paused`): hold the target at whatever
  replicas it has now.

With both, paused-replicas wins (as in KEDA). Removing the annotation resumes autoscaling; the
scale-down stabilisation window then starts afresh. While paused the operator still observes the
queues, reports the status and pages on dead letters. A value it cannot read pauses too (at the
current replicas: the user asked for a pause) and says why in the ScalingActive condition.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

PAUSED_REPLICAS = "taskherd.io/paused-replicas"
PAUSED = "taskherd.io/paused"
#: the same limit as spec.maxReplicas.
MAX_PAUSED_REPLICAS = 1000


@dataclass(frozen=True)
class Pause:
    #: hold at this many replicas; None: hold at the current count.
    replicas: int | None
    #: for the ScalingActive condition and the Event.
    reason: str
    message: str


def pause_from(annotations: Mapping[str, Any] | None) -> Pause | None:
    annotations = annotations or {}
    if PAUSED_REPLICAS in annotations:
        raw = str(annotations[PAUSED_REPLICAS]).strip()
        if raw.isdigit() and int(raw) <= MAX_PAUSED_REPLICAS:
            return Pause(int(raw), "Paused", f"autoscaling paused at {int(raw)} replicas by {PAUSED_REPLICAS}")
        return Pause(None, "InvalidPauseAnnotation",
                     f"annotation {PAUSED_REPLICAS}={raw!r} is invalid: must be a whole number of replicas "
                     f"0-{MAX_PAUSED_REPLICAS}; holding the current replicas until it is fixed or removed")
    if PAUSED in annotations:
        raw = str(annotations[PAUSED]).strip().lower()
        if raw == "true":
            return Pause(None, "Paused", f"autoscaling paused at the current replicas by {PAUSED}")
        if raw == "false":
            return None
        return Pause(None, "InvalidPauseAnnotation",
                     f"annotation {PAUSED}={annotations[PAUSED]!r} is invalid: must be \"true\" or \"false\"; "
                     "holding the current replicas until it is fixed or removed")
    return None
