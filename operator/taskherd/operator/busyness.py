"""Reading how busy a worker pod is: the worker's Prometheus endpoint, over the pod IP.

Why metrics rather than `kubectl exec taskherd probe`: an HTTP GET needs no `pods/exec` RBAC
(exec is close to root in the pod), no websocket stream and no process fork in the worker; the
worker serves `taskherd_tasks_in_flight` on its metrics port anyway. The reader is injectable: handlers take
any `async (pod) -> int | None`.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from taskherd.contract import WORKER_METRICS_PORT

from .deletion_cost import PodBusyness

IN_FLIGHT_METRIC = "taskherd_tasks_in_flight"

BusynessReader = Callable[[Mapping[str, Any]], Awaitable["int | None"]]


def parse_in_flight(text: str, metric: str = IN_FLIGHT_METRIC) -> int | None:
    """Sum of the gauge over its label sets; None when the metric is absent or the text is not
    the Prometheus exposition format."""
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name == metric]
    except ValueError:
        return None
    return int(round(sum(s.value for s in samples))) if samples else None


def pod_is_running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return status.get("phase") == "Running" and bool(status.get("podIP"))


class WorkerMetrics:
    """GET http://<podIP>:<port>/metrics of a worker pod: the text, or None when it cannot be read."""

    def __init__(self, *, port: int = WORKER_METRICS_PORT, timeout: float = 2.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.port = port
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def text(self, pod: Mapping[str, Any]) -> str | None:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        try:
            response = await self._client.get(f"http://{ip}:{self.port}/metrics")
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return response.text


class MetricsBusynessReader(WorkerMetrics):
    """The in-flight gauge of a worker pod."""

    async def __call__(self, pod: Mapping[str, Any]) -> int | None:
        text = await self.text(pod)
        return None if text is None else parse_in_flight(text)


async def read_busyness(pods: list[Mapping[str, Any]], reader: BusynessReader) -> list[PodBusyness]:
    """Every pod's busyness, read concurrently."""
    async def one(pod: Mapping[str, Any]) -> PodBusyness:
        name = pod["metadata"]["name"]
        if not pod_is_running(pod):
            return PodBusyness(name, 0, running=False)
        return PodBusyness(name, await reader(pod))
    return list(await asyncio.gather(*(one(p) for p in pods)))
