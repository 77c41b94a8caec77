"""The pool's throughput from its workers' own counters, for Little's law (scaling.Throughput).

Each worker's /metrics, read with its busyness, carries the tasks it has finished and the seconds
they took (the runtime histogram's count and sum) and the tasks it runs at once
(``taskherd_worker_slots``). The pool's cumulative figures are built from per-pod increments,
because pods come and go and a restarted worker starts its counters at 0: a pod seen for the
first time contributes from its next reading on (what it counted before is not known to fall in
the window), and a counter that went down counts again from 0. The samples then go to
``scaling.estimate_throughput`` with the pool's depth at each reading.

When to read (`reading_due`): whenever the pool is not steady — a scale-up, a scale-down, or one
the stabilisation window holds back — and every STEADY_READING_SECONDS while a steady pool has a
backlog, so that the recommendations made while it drains already carry the throughput when the
window later weighs them. A steady, idle pool costs no reading. The steady readings fall on the
polls where the terminations report reads the pods anyway (plan.needs_busyness), so one request
per pod serves both (busyness.WorkerMetrics).

Pure: the caller keeps the `WorkCounters` between polls (plan.PoolMemory).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from .deletion_cost import PodBusyness
from .scaling import THROUGHPUT_WINDOW_SECONDS, Decision, Throughput, WorkSample, estimate_throughput

#: samples are kept this much longer than the rate window: estimate_throughput times the service
#: over all of them when no task finished within the window (a pool just scaled up from zero)
KEEP_BEYOND_WINDOW_SECONDS = 600.0
#: a steady pool with a backlog is read this often: two or three samples per rate window, and the
#: terminations report's cadence (plan.TERMINATIONS_EVERY_SECONDS), whose pod reading it shares
STEADY_READING_SECONDS = 30.0


def reading_due(decision: Decision, current_replicas: int, depth: int, last_reading_at: float | None,
                now: float) -> bool:
    """Whether this poll reads the workers, given its decision before any reading (module doc)."""
    recommended = decision.recommendation.replicas if decision.recommendation is not None else decision.replicas
    if decision.replicas != current_replicas or recommended != current_replicas:
        return True
    return depth > 0 and (last_reading_at is None or now - last_reading_at >= STEADY_READING_SECONDS)


@dataclass(frozen=True)
class WorkCounters:
    """What the pool's workers counted, made monotonic across pods, and the samples taken so far."""

    completed: float = 0.0
    busy_seconds: float = 0.0
    #: pod name -> (completed, busy seconds) at its last reading
    per_pod: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    samples: tuple[WorkSample, ...] = ()
    #: the largest slot count a worker reported at the last reading; None: none did
    slots: int | None = None

    def read(self, pods: Sequence[PodBusyness], depth: int, now: float) -> "WorkCounters":
        """These counters after one reading of every pod, with the pool's depth at that time."""
        completed, busy, per_pod = self.completed, self.busy_seconds, {}
        for pod in pods:
            if not pod.running or pod.completed is None or pod.busy_seconds is None:
                continue
            per_pod[pod.name] = (pod.completed, pod.busy_seconds)
            if pod.name not in self.per_pod:
                continue
            before_completed, before_busy = self.per_pod[pod.name]
            restarted = pod.completed < before_completed
            completed += pod.completed if restarted else pod.completed - before_completed
            busy += pod.busy_seconds if restarted else max(0.0, pod.busy_seconds - before_busy)
        slots = max((pod.slots for pod in pods if pod.running and pod.slots), default=None)
        kept = [s for s in self.samples if s.at >= now - THROUGHPUT_WINDOW_SECONDS - KEEP_BEYOND_WINDOW_SECONDS]
        sample = WorkSample(at=now, depth=depth, completed=int(round(completed)), busy_seconds=busy)
        return WorkCounters(completed, busy, per_pod, tuple(kept) + (sample,), slots)

    def throughput(self, now: float) -> Throughput | None:
        """Arrival rate and mean service time over the recent samples; None until two readings
        of workers that export their slots fall within the window."""
        if self.slots is None:
            return None
        return estimate_throughput(self.samples, slots_per_worker=self.slots, now=now)
