"""Worker pods as a watcher sees them tick after tick: when each appeared, when it was told to go,
and why — a fault's kill, or else the operator's scale-down. The demo's and the chaos suite's
observers both keep their pods' lives with `track`."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class PodLife:
    """A worker pod seen during the run: when it appeared, when it was told to go, and why."""

    pod: str
    created_at: float
    removed_at: float | None = None  #: when its removal was asked; None while it lives
    cause: str | None = None  #: "killed" (the run's fault) or "scale-down" (the operator)


def parse_time(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def track(lives: dict[str, PodLife], pods: list[dict], now: float, *, killed: Mapping[str, float],
          watch_started: float | None = None) -> None:
    """Updates `lives` with one tick's pods (terminating ones included). `killed`: the pods the run's
    fault removed, and when. With `watch_started`, a pod already leaving before then (a previous
    release's) is not this run's and is left out."""
    seen = set()
    for pod in pods:
        meta = pod["metadata"]
        name = meta["name"]
        seen.add(name)
        created = parse_time(meta.get("creationTimestamp")) or now
        deleted = parse_time(meta.get("deletionTimestamp"))
        # deletionTimestamp is when the grace period ENDS: the removal was asked that long before
        asked = None if deleted is None else deleted - (meta.get("deletionGracePeriodSeconds") or 0)
        if name not in lives and asked is not None and watch_started is not None and asked < watch_started:
            continue
        life = lives.get(name) or PodLife(name, created)
        if asked is not None and life.removed_at is None:
            life = PodLife(name, created, asked, _cause(name, killed))
        lives[name] = life
    for name, life in list(lives.items()):
        if name not in seen and life.removed_at is None:  # vanished at once: a force delete
            lives[name] = PodLife(name, life.created_at, killed.get(name, now), _cause(name, killed))


def _cause(pod: str, killed: Mapping[str, float]) -> str:
    return "killed" if pod in killed else "scale-down"
