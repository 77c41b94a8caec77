"""The verdict: what was sent, what happened, and whether every promise held. Pure.

The ledger rows come from the shop's own tables (effects and attempts, written by the sample app),
the dead-letter queue and Alertmanager; `judge` turns them into a `Verdict` whose `failures` name
every broken invariant. The demo exits non-zero when there is any.
"""
from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping

from e2e.lib.pod_lives import PodLife  # noqa: F401 - part of the verdict's vocabulary


@dataclass(frozen=True)
class Sent:
    """What the demo published, by the key each task's effect is recorded under."""

    charges: tuple[str, ...]  #: valid charges: each must be recorded exactly once
    poison: tuple[str, ...] = ()  #: invalid charges: permanent failure, DLQ after one attempt
    memory_hogs: tuple[str, ...] = ()  #: reports that exceed the memory limit: DLQ after N deliveries


@dataclass(frozen=True)
class Attempt:
    """One start of one task on one worker (a row of the shop's attempts table)."""

    task_id: str
    key: str
    task_name: str
    worker: str  #: pod name (or host process name) that ran it
    started_at: float
    finished_at: float | None = None  #: None: the attempt never finished (its process died)
    outcome: str | None = None


@dataclass(frozen=True)
class DeadLetter:
    task_name: str
    key: str
    reason: str
    attempts: int | None = None
    exception_type: str | None = None


@dataclass(frozen=True)
class Observed:
    effects: Mapping[str, int]  #: key -> number of effect rows
    attempts: tuple[Attempt, ...]
    dead_letters: tuple[DeadLetter, ...]
    alerts: tuple[Mapping, ...] = ()  #: alerts Alertmanager received for the pool's DLQ
    pods: tuple[PodLife, ...] = ()
    min_replicas: int = 1
    max_replicas_seen: int = 0
    final_replicas: int | None = None
    oom_kills: int = 0  #: OOM kills seen in worker pods (memory cgroup counters or OOMKilled status)
    #: the checks a run can switch off (a short run shows fewer faults)
    expect: frozenset[str] = frozenset({"scale-up", "scale-down", "alert", "oom", "kills"})


@dataclass
class Verdict:
    tasks_sent: int
    effects_recorded_once: int
    lost: list[str]
    duplicated: dict[str, int]
    unexpected_effects: list[str]
    attempts_per_task: dict[int, int]  #: number of attempts -> number of charges
    interrupted_attempts: int  #: attempts that never finished (worker killed under them)
    #: attempts on force-deleted pods that never finished (the others ended within the kubelet's 2 s)
    attempts_cut_by_kills: int
    dlq: list[dict]
    alerts: int
    pods_killed: int
    pods_removed_by_scale_down: int
    busy_pods_removed_while_idle_existed: int
    max_replicas_seen: int
    final_replicas: int | None
    oom_kills: int
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def attempts_histogram(attempts: Iterable[Attempt], keys: Iterable[str]) -> dict[int, int]:
    """How many keys ran once, twice, …: {attempt count: number of keys}."""
    per_key = collections.Counter(a.key for a in attempts)
    return dict(sorted(collections.Counter(per_key[k] for k in keys).items()))


#: Clock skew and the one-second resolution of deletionTimestamp: an attempt counts as running at a
#: moment only if it started before it and ended after it by at least this much.
BUSY_MARGIN_SECONDS = 1.0
#: Pods whose deletion falls within this window belong to the same scale-down step.
SAME_STEP_SECONDS = 5.0


def attempt_ends(attempts: Iterable[Attempt], *, hard_limit: float = 600) -> dict[Attempt, float]:
    """When each attempt stopped running. An unfinished one (its process was killed) stopped at the
    latest when the same task started again, else at its hard time limit."""
    attempts = list(attempts)
    restarts = collections.defaultdict(list)
    for a in attempts:
        restarts[a.task_id].append(a.started_at)
    ends = {}
    for a in attempts:
        if a.finished_at is not None:
            ends[a] = a.finished_at
        else:
            later = [t for t in restarts[a.task_id] if t > a.started_at]
            ends[a] = min(later, default=a.started_at + hard_limit)
    return ends


def running_at(worker: str, t: float, ends: Mapping[Attempt, float]) -> bool:
    """Whether `worker` was running an attempt at time `t`, with a margin for clock resolution."""
    m = BUSY_MARGIN_SECONDS
    return any(a.worker == worker and a.started_at < t - m and end > t + m for a, end in ends.items())


def busy_removals(pods: Iterable[PodLife], attempts: Iterable[Attempt], *, decision_lag: float = 0.0) -> list[str]:
    """Pods a scale-down removed while busy although a pod that stayed was idle at that moment.

    That is the promise of pod-deletion-cost: a busy worker goes only when every remaining one is busy.
    `decision_lag`: how old the busyness the scaler acted on may be (an operator polling every 2 s
    annotates from a look up to 2 s before the removal): a removal counts against it only if the pod
    was busy, and a pod that stayed idle, all through that window — what it could have known.
    """
    pods, ends = list(pods), attempt_ends(attempts)
    m = BUSY_MARGIN_SECONDS

    def busy_throughout(worker: str, start: float, end: float) -> bool:
        return any(a.worker == worker and a.started_at < start - m and stop > end + m for a, stop in ends.items())

    def ran_within(worker: str, start: float, end: float) -> bool:
        return any(a.worker == worker and a.started_at < end - m and stop > start + m for a, stop in ends.items())

    found = []
    for p in pods:
        if p.cause != "scale-down" or p.removed_at is None:
            continue
        t = p.removed_at
        if not busy_throughout(p.pod, t - decision_lag, t):
            continue
        stayed = [q for q in pods if q.pod != p.pod and q.created_at <= t - decision_lag
                  and (q.removed_at is None or q.removed_at > t + SAME_STEP_SECONDS)]
        if any(not ran_within(q.pod, t - decision_lag, t) for q in stayed):
            found.append(p.pod)
    return found


def judge(sent: Sent, observed: Observed) -> Verdict:
    charges = set(sent.charges)
    expected_dlq = set(sent.poison) | set(sent.memory_hogs)
    dlq_keys = collections.Counter(d.key for d in observed.dead_letters)
    lost = sorted(k for k in charges if observed.effects.get(k, 0) == 0 and k not in dlq_keys)
    duplicated = {k: n for k, n in sorted(observed.effects.items()) if n > 1}
    unexpected = sorted(k for k, n in observed.effects.items() if n and k not in charges)
    removed_by_scale_down = [p for p in observed.pods if p.cause == "scale-down"]
    busy_removed = busy_removals(observed.pods, observed.attempts)
    kills = [p for p in observed.pods if p.cause == "killed"]

    failures: list[str] = []
    if lost:
        failures.append(f"lost: {len(lost)} charge(s) neither recorded nor in the DLQ: {_few(lost)}")
    if duplicated:
        failures.append(f"duplicated: {len(duplicated)} charge(s) recorded more than once: "
                        f"{_few(f'{k}×{n}' for k, n in duplicated.items())}")
    if unexpected:
        failures.append(f"effects recorded for tasks that must not take effect: {_few(unexpected)}")
    missing_dlq = sorted(expected_dlq - set(dlq_keys))
    if missing_dlq:
        failures.append(f"not in the dead-letter queue although they always fail: {_few(missing_dlq)}")
    extra_dlq = sorted(set(dlq_keys) - expected_dlq)
    if extra_dlq:
        reasons = {d.key: d.reason for d in observed.dead_letters}
        failures.append("dead-lettered although they should succeed: "
                        + _few(f"{k} ({reasons[k]})" for k in extra_dlq))
    twice_in_dlq = sorted(k for k, n in dlq_keys.items() if n > 1)
    if twice_in_dlq:
        failures.append(f"dead-lettered more than once: {_few(twice_in_dlq)}")
    if "alert" in observed.expect and expected_dlq and not observed.alerts:
        failures.append("the DLQ filled but Alertmanager received no page for it")
    if "scale-up" in observed.expect and observed.max_replicas_seen <= observed.min_replicas:
        failures.append(f"the pool never scaled up: at most {observed.max_replicas_seen} replica(s), "
                        f"minReplicas {observed.min_replicas}")
    if "scale-down" in observed.expect and (observed.final_replicas is None
                                            or observed.final_replicas > observed.min_replicas):
        failures.append(f"the pool did not scale back down to minReplicas {observed.min_replicas}: "
                        f"{observed.final_replicas} replica(s) at the end")
    if busy_removed:
        failures.append("scale-down removed a busy worker while an idle one stayed: " + _few(busy_removed))
    if "oom" in observed.expect and sent.memory_hogs and observed.oom_kills == 0:
        failures.append("the memory-hungry task never hit the memory limit (no OOM kill seen)")
    if "kills" in observed.expect and not kills:
        failures.append("no worker pod was killed: the fault did not happen")

    return Verdict(
        tasks_sent=len(sent.charges) + len(sent.poison) + len(sent.memory_hogs),
        effects_recorded_once=sum(1 for k in charges if observed.effects.get(k, 0) == 1),
        lost=lost,
        duplicated=duplicated,
        unexpected_effects=unexpected,
        attempts_per_task=attempts_histogram(observed.attempts, sent.charges),
        interrupted_attempts=sum(1 for a in observed.attempts if a.finished_at is None),
        attempts_cut_by_kills=sum(1 for a in observed.attempts if a.finished_at is None
                                  and a.worker in {p.pod for p in kills}),
        dlq=[asdict(d) for d in observed.dead_letters],
        alerts=len(observed.alerts),
        pods_killed=len(kills),
        pods_removed_by_scale_down=len(removed_by_scale_down),
        busy_pods_removed_while_idle_existed=len(busy_removed),
        max_replicas_seen=observed.max_replicas_seen,
        final_replicas=observed.final_replicas,
        oom_kills=observed.oom_kills,
        failures=failures,
    )


def _few(items: Iterable[str], limit: int = 5) -> str:
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown + (f" … (+{len(items) - limit} more)" if len(items) > limit else "")
