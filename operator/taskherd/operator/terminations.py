"""Why workers died recently, from pod containerStatuses and the kubelet's Events (pure).

Kubernetes records the last termination of each container (`lastState.terminated`: reason such
as OOMKilled or Error, exit code, finish time) and a restart count; a liveness kill shows up only
as an Event ("Container worker failed liveness probe, will be restarted"), so the two are joined.
Pool processes that died while their container lived on (child_deaths.py) join the same list.
The list is merged with what the status already showed, so a deleted pod's death stays visible.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Iterable, Mapping

#: how many terminations the status keeps.
DEFAULT_LIMIT = 10
#: a liveness kill Event this close before the container finished explains that termination.
LIVENESS_MATCH_SECONDS = 300.0


def _ts(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _liveness_kills(events: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[float]]:
    kills: dict[tuple[str, str], list[float]] = {}
    for event in events:
        message = event.get("message") or ""
        if event.get("reason") != "Killing" or "liveness" not in message.lower():
            continue
        obj = event.get("involvedObject") or {}
        # fieldPath looks like "spec.containers{worker}"
        field_path = obj.get("fieldPath") or ""
        container = field_path[field_path.find("{") + 1:-1] if "{" in field_path else ""
        at = _ts(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp"))
        if at is not None:
            kills.setdefault((obj.get("name", ""), container), []).append(at)
    return kills


def _explain(reason: str, exit_code: int | None, liveness: bool) -> str:
    if liveness:
        return "LivenessProbeFailed"
    if reason:
        return reason
    return f"ExitCode{exit_code}" if exit_code is not None else "Unknown"


def terminations_from(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    kills = _liveness_kills(events)
    found: list[dict[str, Any]] = []
    for pod in pods:
        name = pod["metadata"]["name"]
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            for state_key in ("lastState", "state"):
                terminated = (status.get(state_key) or {}).get("terminated")
                if not terminated:
                    continue
                finished = _ts(terminated.get("finishedAt"))
                container = status.get("name", "")
                liveness = finished is not None and any(
                    finished - LIVENESS_MATCH_SECONDS <= at <= finished + 5
                    for at in kills.get((name, container), []) + kills.get((name, ""), []))
                exit_code = terminated.get("exitCode")
                found.append({
                    "pod": name, "container": container,
                    "reason": _explain(terminated.get("reason") or "", exit_code, liveness),
                    "exitCode": exit_code, "finishedAt": terminated.get("finishedAt"),
                    "restartCount": status.get("restartCount", 0),
                    **({"message": terminated["message"][:200]} if terminated.get("message") else {}),
                })
    return found


def termination_key(item: Mapping[str, Any]) -> tuple:
    """What makes two entries the same termination: pod, container or process, and when."""
    return item.get("pod"), item.get("container"), item.get("process"), item.get("finishedAt")


def recent_terminations(pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]],
                        previous: Iterable[Mapping[str, Any]] = (), limit: int = DEFAULT_LIMIT,
                        pool_children: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Newest first, one entry per termination_key, at most `limit`; `pool_children` are the
    entries of child_deaths.child_death_entries."""
    merged: dict[tuple, dict[str, Any]] = {}
    for item in list(previous) + list(pool_children) + terminations_from(pods, events):
        merged[termination_key(item)] = dict(item)  # the fresh reading wins (restart count, liveness reason)
    ordered = sorted(merged.values(), key=lambda t: _ts(t.get("finishedAt")) or 0.0, reverse=True)
    return ordered[:limit]
