"""In-memory stand-ins for the operator's injected dependencies (fast tests of the poll loop)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from taskherd.operator.busyness import PodReading
from taskherd.operator.kube import NotFound, Scale
from taskherd.operator.metrics import OperatorMetrics
from taskherd.operator.plan import PoolMemory
from taskherd.operator.poll import Deps, poll_once
from taskherd.operator.scaling import Observation


@dataclass
class FakeKube:
    replicas: dict[str, int] = field(default_factory=dict)
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[dict[str, Any]] = field(default_factory=list)
    scale_calls: list[int] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    posted_events: list[tuple[str, str, str]] = field(default_factory=list)

    async def read_secret(self, namespace, name):
        return {"url": "redis://localhost"}

    async def get_scale(self, namespace, target):
        if target.name not in self.replicas:
            raise NotFound(target.name)
        return Scale(self.replicas[target.name], self.replicas[target.name], "app=w")

    async def set_scale(self, namespace, target, replicas):
        self.scale_calls.append(replicas)
        self.replicas[target.name] = replicas

    async def list_pods(self, namespace, selector):
        return self.pods

    async def list_pod_events(self, namespace):
        return self.events

    async def annotate_pod(self, namespace, name, key, value):
        self.annotations[name] = value
        for pod in self.pods:
            if pod["metadata"]["name"] == name:
                pod["metadata"].setdefault("annotations", {})[key] = value

    async def patch_pool_status(self, namespace, name, status):
        self.statuses.append(status)

    async def post_event(self, namespace, pool, *, type, reason, message):
        self.posted_events.append((type, reason, message))


class FakeBroker:
    def __init__(self, observation: Observation | None = None, error: Exception | None = None):
        self.observation, self.error = observation, error

    async def __call__(self, namespace, broker):
        if self.error:
            raise self.error
        return self.observation


class Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_deps(kube, broker, *, busy: dict[str, int | None] | None = None, posts=None, clock=None,
              fail_posts: bool = False, child_deaths: dict[str, list] | None = None) -> Deps:
    """`child_deaths`: pod name -> what its worker's metrics say (a pod missing: unreadable)."""
    busy = busy or {}
    posts = [] if posts is None else posts
    child_deaths = {} if child_deaths is None else child_deaths

    async def reader(pod):
        in_flight = busy.get(pod["metadata"]["name"], 0)
        return None if in_flight is None else PodReading(in_flight=in_flight)

    async def death_reader(pod):
        return child_deaths.get(pod["metadata"]["name"])

    async def poster(url, body):
        if fail_posts:
            raise ConnectionError("alertmanager down")
        posts.append((url, body))

    return Deps(kube=kube, observe=broker, busyness=reader, poster=poster, child_deaths=death_reader,
                metrics=OperatorMetrics(registry=CollectorRegistry()), clock=clock or Clock())


def pool_body(**spec) -> dict[str, Any]:
    base = {"scaleTargetRef": {"name": "workers"},
            "broker": {"type": "redis", "secretRef": {"name": "broker"}, "queues": ["celery"]},
            "minReplicas": 0, "maxReplicas": 10, "targetDepthPerWorker": 5,
            "scaleDownStabilizationSeconds": 60}
    base.update(spec)
    return {"metadata": {"name": "pool", "namespace": "ns", "generation": 1, "uid": "u"}, "spec": base}


def running_pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Running", "podIP": "10.0.0.1",
                                                   "containerStatuses": [{"name": "worker", "restartCount": 0}]}}


class PolledPool:
    """One WorkerPool polled again and again as the scheduler does: the memory of one poll and the
    status it wrote are what the next poll starts from."""

    def __init__(self, deps: Deps, body: dict[str, Any] | None = None) -> None:
        self.deps, self.body, self.memory = deps, body or pool_body(), PoolMemory()
        self.last = None

    def poll(self) -> dict[str, Any]:
        self.last = asyncio.run(poll_once(self.body, self.memory, self.deps))
        self.memory = self.last.memory
        if self.last.status is not None:
            self.body["status"] = {k: v for k, v in self.last.status.items() if v is not None}
        return self.last.status
