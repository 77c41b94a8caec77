"""A discrete-event model of one worker pool under an autoscaler, for bench/autoscaling.py.

What is modelled, and why each choice:

- **Tasks** arrive at the times of a trace and wait in one FIFO queue; each pod runs
  `concurrency` of them at once (prefork, prefetch 1, late acks: a pod holds only what it runs).
  A free slot takes the oldest waiting task at once (BRPOP / basic.consume push).
- **Pods** are created by a scale call and become Ready *and take tasks* after a start time drawn
  from what bench/scaleup.py measured on the local cluster (scale call -> first task). A scale-down
  removes starting pods first (the ReplicaSet deletes not-ready pods first), then, depending on the
  scaler, idle pods (taskherd annotates pod-deletion-cost from busyness) or the newest pods (the
  ReplicaSet's default ranking, busy or not). A removed busy pod drains: it takes nothing new and
  finishes what it runs (preStop drain + warm shutdown), then is gone.
- **Replica-seconds** count every pod from its scale call to its end (a starting or draining pod
  is billed like a working one).
- **Observations** are what each scaler can see: ready messages, unacknowledged (running)
  messages, the oldest ready message's age, busy pods.

The scalers are in bench/autoscaling.py; this module only runs them.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

#: How a scale-down picks its victims among ready pods.
IDLE_FIRST, NEWEST_FIRST = "idle-first", "newest-first"


@dataclass(frozen=True)
class Trace:
    name: str
    #: arrival times, seconds, sorted
    arrivals: Sequence[float]
    #: service time of each task, seconds
    services: Sequence[float]
    #: seconds simulated (the end of the trace, idle tail included)
    horizon: float
    description: str = ""


@dataclass(frozen=True)
class View:
    """What a scaler may observe at one instant."""

    now: float
    #: the Deployment's spec.replicas (pods starting or ready, not the draining ones)
    replicas: int
    ready_messages: int
    #: delivered, not yet acknowledged: the tasks running now (draining pods included)
    unacked_messages: int
    oldest_ready_age: float | None
    #: pods (not draining) running at least one task
    busy_pods: int
    #: tasks finished since the start (a counter scraped from the workers' metrics)
    completed: int
    #: tasks published since the start (a broker's publish counter)
    published: int
    #: total seconds of service of the completed tasks
    service_seconds: float


class Scaler(Protocol):
    #: label in the report
    name: str
    #: IDLE_FIRST or NEWEST_FIRST
    removal: str

    def first_poll(self, rng: random.Random) -> float:
        """Time of the first decision (random phase)."""

    def poll(self, view: View) -> tuple[int | None, float]:
        """(replicas to set or None, time of the next poll)."""


@dataclass
class _Pod:
    id: int
    created: float
    ready_at: float
    busy: int = 0
    draining: bool = False
    ready: bool = False
    gone_at: float | None = None


@dataclass
class Result:
    waits: list[float] = field(default_factory=list)
    replica_seconds: float = 0.0
    peak_replicas: int = 0
    #: (time, replicas) after each change of spec.replicas
    replica_trace: list[tuple[float, int]] = field(default_factory=list)
    #: (time, ready messages) at each of the scaler's polls
    ready_trace: list[tuple[float, int]] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        if not self.waits:
            return math.nan
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def over(self, limit: float) -> float:
        """Share of tasks that waited longer than `limit` seconds."""
        return sum(1 for w in self.waits if w > limit) / len(self.waits) if self.waits else 0.0


class Simulation:
    def __init__(self, trace: Trace, scaler: Scaler, *, concurrency: int, initial_replicas: int,
                 start_seconds: Callable[[], float], rng: random.Random):
        self.trace, self.scaler, self.concurrency = trace, scaler, concurrency
        self.start_seconds = start_seconds
        self.rng = rng
        self.queue: deque[int] = deque()
        self.pods: dict[int, _Pod] = {}
        self.events: list[tuple[float, int, str, int]] = []
        self.sequence = 0
        self.result = Result()
        #: running task -> its pod
        self.running: dict[int, int] = {}
        self.completed = 0
        self.service_done = 0.0
        self.started = 0
        for _ in range(initial_replicas):
            pod = self._new_pod(-math.inf, ready_at=0.0)
            pod.ready = True
        self._note_replicas(0.0)

    # -- events -------------------------------------------------------------------------------
    def _push(self, at: float, kind: str, ref: int) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (at, self.sequence, kind, ref))

    def run(self) -> Result:
        arrivals, horizon = self.trace.arrivals, self.trace.horizon
        self._push(self.scaler.first_poll(self.rng), "poll", 0)
        next_arrival = 0
        while True:
            t_arrival = arrivals[next_arrival] if next_arrival < len(arrivals) else math.inf
            t_event = self.events[0][0] if self.events else math.inf
            now = min(t_arrival, t_event)
            if now > horizon:
                break
            if t_arrival <= t_event:
                self.queue.append(next_arrival)
                next_arrival += 1
            else:
                _, _, kind, ref = heapq.heappop(self.events)
                if kind == "poll":
                    self._poll(now)
                elif kind == "ready":
                    pod = self.pods.get(ref)
                    if pod is not None and pod.gone_at is None:
                        pod.ready = True
                elif kind == "finish":
                    self._finish(now, ref)
            self._dispatch(now)
        for pod in self.pods.values():
            end = min(pod.gone_at if pod.gone_at is not None else horizon, horizon)
            self.result.replica_seconds += max(0.0, end - max(pod.created, 0.0))
        return self.result

    def _poll(self, now: float) -> None:
        view = self.view(now)
        self.result.ready_trace.append((now, view.ready_messages))
        replicas, next_at = self.scaler.poll(view)
        if replicas is not None:
            self.set_replicas(now, replicas)
        self._push(next_at, "poll", 0)

    def _finish(self, now: float, task: int) -> None:
        pod = self.pods[self.running.pop(task)]
        pod.busy -= 1
        self.completed += 1
        self.service_done += self.trace.services[task]
        if pod.draining and pod.busy == 0:
            pod.gone_at = now

    def _dispatch(self, now: float) -> None:
        if not self.queue:
            return
        free = [p for p in self.pods.values() if p.ready and not p.draining and p.gone_at is None
                and p.busy < self.concurrency]
        free.sort(key=lambda p: (p.busy, p.ready_at))
        for pod in free:
            while self.queue and pod.busy < self.concurrency:
                task = self.queue.popleft()
                self.result.waits.append(now - self.trace.arrivals[task])
                self.started += 1
                pod.busy += 1
                self.running[task] = pod.id
                self._push(now + self.trace.services[task], "finish", task)
            if not self.queue:
                return

    # -- the Deployment -----------------------------------------------------------------------
    def _new_pod(self, now: float, ready_at: float) -> _Pod:
        pod = _Pod(id=len(self.pods), created=now, ready_at=ready_at)
        self.pods[pod.id] = pod
        return pod

    def active_pods(self) -> list[_Pod]:
        return [p for p in self.pods.values() if p.gone_at is None and not p.draining]

    def set_replicas(self, now: float, replicas: int) -> None:
        active = self.active_pods()
        if replicas > len(active):
            for _ in range(replicas - len(active)):
                pod = self._new_pod(now, ready_at=now + self.start_seconds())
                self._push(pod.ready_at, "ready", pod.id)
        elif replicas < len(active):
            for pod in self._victims(active, len(active) - replicas):
                if pod.busy:
                    pod.draining = True
                else:
                    pod.gone_at = now
        self._note_replicas(now)

    def _victims(self, pods: list[_Pod], count: int) -> list[_Pod]:
        starting = [p for p in pods if not p.ready]
        ready = [p for p in pods if p.ready]
        if self.scaler.removal == IDLE_FIRST:
            ready.sort(key=lambda p: (p.busy > 0, p.busy, -p.ready_at))
        else:  # the ReplicaSet's ranking without deletion costs: the youngest first, busy or not
            ready.sort(key=lambda p: -p.ready_at)
        starting.sort(key=lambda p: -p.created)
        return (starting + ready)[:count]

    def _note_replicas(self, now: float) -> None:
        replicas = len(self.active_pods())
        self.result.peak_replicas = max(self.result.peak_replicas, replicas)
        if not self.result.replica_trace or self.result.replica_trace[-1][1] != replicas:
            self.result.replica_trace.append((now, replicas))

    def view(self, now: float) -> View:
        active = self.active_pods()
        head = self.queue[0] if self.queue else None
        return View(now=now, replicas=len(active), ready_messages=len(self.queue),
                    unacked_messages=sum(p.busy for p in self.pods.values() if p.gone_at is None),
                    oldest_ready_age=None if head is None else now - self.trace.arrivals[head],
                    busy_pods=sum(1 for p in active if p.busy > 0), completed=self.completed,
                    published=self.started + len(self.queue), service_seconds=self.service_done)
