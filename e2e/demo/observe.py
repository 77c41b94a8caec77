"""Watching the run: one kubectl call and one ledger query per tick, turned into timeline samples,
pod lifetimes and the latest picture the scenario acts on (which pod is busy, what the operator said).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

import psycopg

from e2e.lib import cluster as clusters
from e2e.lib import pod_lives
from e2e.lib.pod_lives import PodLife, is_ready
from e2e.lib.sampling import Sampler

from .config import NAMESPACE
from .timeline import Sample

#: an attempt not finished after this long is a dead one (hard limit 30 s + margin), not in flight
IN_FLIGHT_HORIZON_SECONDS = 40


def _matches(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class Snapshot:
    """The latest tick, for the scenario and the narration."""

    at: float = 0.0
    pool_status: dict = field(default_factory=dict)
    pool_spec: dict = field(default_factory=dict)
    pods: list[dict] = field(default_factory=list)  #: the pool's pods, terminating ones included
    in_flight: dict[str, int] = field(default_factory=dict)  #: pod -> attempts running on it
    sample: Sample | None = None


class Observer(Sampler):
    """Samples the pool every `interval` seconds in a thread until `stop()`."""
    name = "demo-observer"

    def __init__(self, *, cluster: clusters.Cluster, database_url: str, t0: float, interval: float = 2.0):
        super().__init__(t0=t0, interval=interval, error_chars=100_000)
        self.cluster = cluster
        self.database_url = database_url
        self.watch_started = time.time()
        self.samples: list[Sample] = []
        self.latest = Snapshot()
        self.lives: dict[str, PodLife] = {}
        self.killed: dict[str, float] = {}
        self.oom_killed_containers: set[tuple[str, int]] = set()

    # ---- the scenario tells us what it did
    def mark_killed(self, pod: str, at: float) -> None:
        with self._lock:
            self.killed[pod] = at

    # ---- one tick
    def tick(self) -> Snapshot:
        now = time.time()
        listing = self.cluster.kubectl_json("get", "workerpools,deployments,pods", "-n", NAMESPACE, timeout=30)
        items = listing.get("items", [])
        pools = [i for i in items if i["kind"] == "WorkerPool"]
        pool = pools[0] if pools else {}
        spec, status = pool.get("spec") or {}, pool.get("status") or {}
        target = (spec.get("scaleTargetRef") or {}).get("name")
        deployment = next((i for i in items if i["kind"] == "Deployment" and i["metadata"]["name"] == target), None)
        selector = ((deployment or {}).get("spec") or {}).get("selector", {}).get("matchLabels") or {"-": "-"}
        pods = [i for i in items if i["kind"] == "Pod" and _matches(i["metadata"].get("labels"), selector)]
        in_flight = self._in_flight({p["metadata"]["name"] for p in pods})
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        sample = Sample(
            t=round(now - self.t0, 2),
            depth=status.get("observedDepth"),
            oldest_age_seconds=status.get("oldestMessageAgeSeconds"),
            replicas=len(live),
            ready_replicas=sum(1 for p in live if is_ready(p)),
            desired_replicas=status.get("desiredReplicas"),
            dlq_depth=status.get("deadLetterDepth"),
        )
        with self._lock:
            pod_lives.track(self.lives, pods, now, killed=self.killed, watch_started=self.watch_started)
            self._track_oom(pods)
            self.samples.append(sample)
            self.latest = Snapshot(at=now, pool_status=status, pool_spec=spec, pods=pods, in_flight=in_flight,
                                   sample=sample)
        return self.latest

    def _in_flight(self, pod_names: set[str]) -> dict[str, int]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.database_url, autocommit=True, connect_timeout=10)
        # an unfinished attempt whose task started again later died (OOM, kill): not in flight
        rows = self._conn.execute(
            "SELECT a.worker, count(*) FROM shop_attempts a WHERE a.finished_at IS NULL "
            "AND a.started_at > clock_timestamp() - make_interval(secs => %s) "
            "AND NOT EXISTS (SELECT 1 FROM shop_attempts b WHERE b.task_id = a.task_id AND b.id > a.id) "
            "GROUP BY a.worker", (IN_FLIGHT_HORIZON_SECONDS,)).fetchall()
        return {w: n for w, n in rows if w in pod_names}

    def _track_oom(self, pods: list[dict]) -> None:
        for p in pods:
            for c in (p.get("status") or {}).get("containerStatuses") or []:
                for state in (c.get("state") or {}, c.get("lastState") or {}):
                    if (state.get("terminated") or {}).get("reason") == "OOMKilled":
                        self.oom_killed_containers.add((p["metadata"]["name"], c.get("restartCount", 0)))

    # ---- results
    def pod_lives(self) -> tuple[PodLife, ...]:
        with self._lock:
            return tuple(self.lives.values())
