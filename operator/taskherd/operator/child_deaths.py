"""Pool processes that died inside running worker pods, from the workers' metrics.

With prefork, the OOM killer (or any SIGKILL) usually takes one pool child, not the container:
Kubernetes records no termination, so `terminations.py` sees nothing. The worker's main process
names and counts each such death (taskherd.worker.child_deaths):
`taskherd_pool_child_deaths_total{task,cause}` and
`taskherd_pool_child_last_death_timestamp_seconds{task,cause}`. With every termination report the
operator reads them from each running worker pod; each (pod, task, cause) whose last death it has
not listed yet becomes an entry of `status.recentTerminations` (`process: pool-child`, the task,
how many so far in that pod, when the last one happened) and a Warning Event. The entry's time is
the worker's, so an operator that restarts, or reads the same figures again, lists nothing twice.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping

from .alerts import rfc3339
from .busyness import WorkerMetrics, pod_is_running, samples_named

DEATHS_METRIC = "taskherd_pool_child_deaths_total"
LAST_DEATH_METRIC = "taskherd_pool_child_last_death_timestamp_seconds"
#: what a death reading asks the worker for (busyness.WorkerMetrics names)
DEATH_SAMPLES = (DEATHS_METRIC, LAST_DEATH_METRIC)
#: the `process` of a recentTerminations entry that is a pool child, not a container
POOL_CHILD = "pool-child"
OOM_KILLED = "OOMKilled"


@dataclass(frozen=True)
class ChildDeaths:
    """The deaths of one task's pool processes in one pod, by one cause."""

    task: str
    cause: str
    count: int
    #: Unix time of the last one
    last_at: float


ChildDeathReader = Callable[[Mapping[str, Any]], Awaitable["list[ChildDeaths] | None"]]


def parse_child_deaths(text: str) -> list[ChildDeaths] | None:
    """Every (task, cause) with at least one death and a time; None when the lines of those
    samples do not parse (busyness.samples_named)."""
    counts: dict[tuple[str, str], float] = {}
    last: dict[tuple[str, str], float] = {}
    samples = samples_named(text, DEATH_SAMPLES)
    if samples is None:
        return None
    for sample in samples:
        key = (sample.labels.get("task", "unknown"), sample.labels.get("cause", "Unknown"))
        if sample.name == DEATHS_METRIC:
            counts[key] = counts.get(key, 0.0) + sample.value
        else:
            last[key] = max(last.get(key, 0.0), sample.value)
    return sorted((ChildDeaths(task, cause, int(count), last[(task, cause)])
                   for (task, cause), count in counts.items() if count >= 1 and last.get((task, cause))),
                  key=lambda d: d.last_at)


class MetricsChildDeathReader:
    """The pool-child deaths a worker pod counted since its worker started."""

    def __init__(self, metrics: WorkerMetrics | None = None, **options: Any) -> None:
        self.metrics = metrics or WorkerMetrics(**options)

    async def __call__(self, pod: Mapping[str, Any]) -> list[ChildDeaths] | None:
        text = await self.metrics.text(pod)
        return None if text is None else parse_child_deaths(text)


async def read_child_deaths(pods: Iterable[Mapping[str, Any]],
                            reader: ChildDeathReader) -> dict[str, list[ChildDeaths]]:
    """Running pod name -> its deaths, read concurrently; pods that could not be read are left out."""
    running = [p for p in pods if pod_is_running(p)]
    readings = await asyncio.gather(*(reader(p) for p in running))
    return {p["metadata"]["name"]: list(r) for p, r in zip(running, readings) if r}


def child_death_entries(readings: Mapping[str, Iterable[ChildDeaths]]) -> list[dict[str, Any]]:
    """recentTerminations entries, one per (pod, task, cause), dated by its last death."""
    return [{"pod": pod, "process": POOL_CHILD, "reason": d.cause, "task": d.task, "count": d.count,
             "finishedAt": rfc3339(d.last_at)}
            for pod, deaths in readings.items() for d in deaths]


def describe(entry: Mapping[str, Any]) -> tuple[str, str]:
    """(Event reason, message) of a pool child's death."""
    reason = "PoolChildOOMKilled" if entry["reason"] == OOM_KILLED else "PoolChildDied"
    how = "was OOM-killed (its container's memory limit)" if entry["reason"] == OOM_KILLED else f"died: {entry['reason']}"
    return reason, (f"pod {entry['pod']}: the pool process running {entry['task']} {how}; "
                    f"{entry['count']} such death(s) in this pod; the task went back to its queue")
