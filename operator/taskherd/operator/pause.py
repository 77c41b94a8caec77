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

from taskherd.contract import shown

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


def replicas_from(raw: str) -> int | None:
    """`raw` as a count of replicas 0-MAX_PAUSED_REPLICAS, or None. ASCII digits only, as KEDA's
    Go strconv reads its annotation: str.isdigit() is also true of '²' (which int() refuses) and
    of '٣' (which int() reads as 3 where KEDA refuses it). Leading zeros are dropped before int():
    a value of thousands of digits would be a ValueError of its own (int's digit limit)."""
    if not raw.isascii() or not raw.isdigit():
        return None
    digits = raw.lstrip("0") or "0"
    if len(digits) > len(str(MAX_PAUSED_REPLICAS)) or int(digits) > MAX_PAUSED_REPLICAS:
        return None
    return int(digits)


def pause_from(annotations: Mapping[str, Any] | None) -> Pause | None:
    """The pause the annotations ask for; never raises (a value it cannot read is an
    InvalidPauseAnnotation pause naming the annotation and what is valid)."""
    if not isinstance(annotations, Mapping):  # the API server's are; a hand-built body's may not be
        annotations = {}
    if PAUSED_REPLICAS in annotations:
        raw = str(annotations[PAUSED_REPLICAS]).strip()
        replicas = replicas_from(raw)
        if replicas is not None:
            return Pause(replicas, "Paused", f"autoscaling paused at {replicas} replicas by {PAUSED_REPLICAS}")
        return Pause(None, "InvalidPauseAnnotation",
                     f"annotation {PAUSED_REPLICAS}={shown(raw, 80)} is invalid: must be a whole number of replicas "
                     f"0-{MAX_PAUSED_REPLICAS} (ASCII digits); holding the current replicas until it is fixed "
                     "or removed")
    if PAUSED in annotations:
        raw = str(annotations[PAUSED]).strip().lower()
        if raw == "true":
            return Pause(None, "Paused", f"autoscaling paused at the current replicas by {PAUSED}")
        if raw == "false":
            return None
        return Pause(None, "InvalidPauseAnnotation",
                     f"annotation {PAUSED}={shown(annotations[PAUSED], 80)} is invalid: must be \"true\" or \"false\"; "
                     "holding the current replicas until it is fixed or removed")
    return None


def unreadable(exc: BaseException) -> Pause:
    """The pause when the annotations could not be read at all (a bug, not a user's value)."""
    return Pause(None, "InvalidPauseAnnotation",
                 f"annotations {PAUSED_REPLICAS} / {PAUSED} not read ({type(exc).__name__}): "
                 f"{PAUSED_REPLICAS} must be a whole number of replicas 0-{MAX_PAUSED_REPLICAS}, {PAUSED} "
                 "\"true\" or \"false\"; holding the current replicas until it is fixed or removed")
