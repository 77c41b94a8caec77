"""Idle workers first: pod-deletion-cost from each pod's busyness, so a scale-down removes idle pods.

The ReplicaSet controller deletes pods with the LOWEST `controller.kubernetes.io/pod-deletion-cost`
first (after pods that are not ready/not running, which it always removes first). We give every
idle pod a cost below every busy pod, and among busy pods order by tasks in flight, so a busy pod
is never chosen while an idle one exists. A running pod whose busyness cannot be read is treated
as the busiest: never delete what we cannot prove idle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: cost of a pod that cannot be read; above any busy pod's cost (in-flight counts are capped below it).
UNKNOWN_COST = 1_000_000
IDLE_COST = 0
#: a pod that is not running (pending, starting, terminating) holds no task: it goes first.
NOT_RUNNING_COST = -1000


@dataclass(frozen=True)
class PodBusyness:
    name: str
    #: tasks in flight; None when the pod could not be read.
    in_flight: int | None
    running: bool = True
    #: the worker's own counters, read with it (None: not exported or unreadable): tasks it has
    #: finished, the seconds they took, and the tasks it runs at once (taskherd.operator.throughput)
    completed: float | None = None
    busy_seconds: float | None = None
    slots: int | None = None

    @property
    def busy(self) -> bool:
        return self.running and (self.in_flight is None or self.in_flight > 0)


def cost_of(pod: PodBusyness) -> int:
    if not pod.running:
        return NOT_RUNNING_COST
    if pod.in_flight is None:
        return UNKNOWN_COST
    return IDLE_COST if pod.in_flight <= 0 else min(pod.in_flight, UNKNOWN_COST - 1)


def deletion_costs(pods: Iterable[PodBusyness]) -> dict[str, int]:
    """pod name -> cost to annotate."""
    return {pod.name: cost_of(pod) for pod in pods}


def annotations_to_change(costs: Mapping[str, int], current: Mapping[str, str | None]) -> dict[str, int]:
    """Only the pods whose annotation differs: a steady pool costs no API writes."""
    return {name: cost for name, cost in costs.items() if current.get(name) != str(cost)}


def busy_count(pods: Iterable[PodBusyness]) -> int:
    return sum(1 for pod in pods if pod.busy)


def removed_by_replicaset(costs: Mapping[str, int], remove: int) -> list[str]:
    """A model of the ReplicaSet's choice (lowest cost first; ties in any order): used by the tests
    and the docs to state what the annotations achieve."""
    return [name for name, _ in sorted(costs.items(), key=lambda item: item[1])[:remove]]
