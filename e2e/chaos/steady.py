"""Steady state and settling, as pure decisions the runner polls.

- the **steady state** a fault file names before and after its fault (spec.STEADY_STATES);
- **settled**: every task the scenario sent has its outcome — a confirmed normal task applied (or
  in the DLQ, which the checker then reports), a poison task in the DLQ — so the checker can judge.
"""
from __future__ import annotations

from typing import Iterable

from .checker import SentTask
from .observe import Snapshot


def steady_problems(names: Iterable[str], snap: Snapshot, *, queue_depth: int | None, outbox_pending: int | None,
                    min_replicas: int) -> list[str]:
    """What keeps each named steady state from holding now (empty: all hold)."""
    problems = []
    for name in names:
        if name == "workers-ready":
            live, ready = snap.live_workers(), snap.ready_workers()
            desired = snap.pool_status.get("desiredReplicas")
            if len(live) < min_replicas or len(ready) != len(live) or desired not in (None, len(live)):
                problems.append(f"workers-ready: {len(ready)} ready of {len(live)} worker pods, the WorkerPool "
                                f"wants {desired} (minReplicas {min_replicas})")
        elif name == "queue-empty":
            if queue_depth != 0:
                problems.append(f"queue-empty: the work queue holds {queue_depth} message(s) (ready + unacked)")
        elif name == "operator-leading":
            if snap.leader_pod() is None:
                problems.append(f"operator-leading: the Lease holder {snap.lease_holder!r} is not a running "
                                f"operator pod")
        elif name == "pool-at-minimum":
            # a scale-down is over only when the operator has come all the way down with the load gone
            live, desired = len(snap.live_workers()), snap.pool_status.get("desiredReplicas")
            if live != min_replicas or desired != min_replicas:
                problems.append(f"pool-at-minimum: {live} worker pod(s), the WorkerPool wants {desired}, "
                                f"not yet minReplicas {min_replicas}")
        elif name == "outbox-empty":
            if outbox_pending != 0:
                problems.append(f"outbox-empty: {outbox_pending} outbox row(s) not yet relayed")
    return problems


def unsettled(sent: Iterable[SentTask], applied: set[str], dead_lettered: set[str]) -> list[str]:
    """Keys of confirmed tasks still without an outcome: a normal task neither applied nor in the
    DLQ, a poison task not in the DLQ. (Indeterminate publishes may never arrive: not awaited.)"""
    waiting = []
    for task in sent:
        if not task.confirmed:
            continue
        done = task.key in dead_lettered if task.kind != "normal" else task.key in applied or task.key in dead_lettered
        if not done:
            waiting.append(task.key)
    return sorted(waiting)
