"""Watching a scenario: every `interval` seconds one kubectl call (pods, WorkerPool, Lease), one
queue inspection and one ledger query, turned into timeline samples, worker pod lifetimes and the
latest picture the triggers and actions act on (which worker is busiest, who leads).

A tick that fails (the broker restarting, PostgreSQL down) leaves a gap in the timeline, not a
crash: the errors are kept and go to summary.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import psycopg

from e2e.lib import pod_lives
from e2e.lib.pod_lives import PodLife, is_ready
from e2e.lib.sampling import Sampler
from taskherd.queues import inspect_queues

from .deploy import Release, WORKER_SELECTOR

#: an attempt unfinished after this long is dead (hard limit 30 s + margin), not in flight
IN_FLIGHT_HORIZON_SECONDS = 40


def restarts(pod: Mapping[str, Any]) -> int:
    return sum(c.get("restartCount", 0) for c in (pod.get("status") or {}).get("containerStatuses") or [])


@dataclass(frozen=True)
class Sample:
    t: float  #: seconds since the scenario's load started
    depth: int | None  #: ready + unacked in the work queue
    oldest_age_seconds: float | None
    dlq_depth: int | None
    replicas: int  #: worker pods that exist and are not terminating
    ready_replicas: int
    desired_replicas: int | None  #: what the WorkerPool asks for
    in_flight: int | None  #: attempts running (from the ledger)
    restarts: int  #: container restarts of the worker pods, summed


@dataclass
class Snapshot:
    at: float = 0.0
    workers: list[dict] = field(default_factory=list)  #: worker pods, terminating ones included
    operators: list[dict] = field(default_factory=list)
    pool_status: dict = field(default_factory=dict)
    lease_holder: str | None = None
    in_flight: dict[str, int] = field(default_factory=dict)  #: pod -> attempts running on it
    sample: Sample | None = None

    def live_workers(self) -> list[dict]:
        return [p for p in self.workers if not p["metadata"].get("deletionTimestamp")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def ready_workers(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.live_workers() if is_ready(p))

    def busiest_worker(self) -> str | None:
        """The ready worker running the most attempts (None when none runs any)."""
        ready = set(self.ready_workers())
        busy = sorted(((n, pod) for pod, n in self.in_flight.items() if pod in ready and n), reverse=True)
        return busy[0][1] if busy else None

    def leader_pod(self) -> str | None:
        """The operator pod holding the Lease (its identity is `<pod name>-<6 hex>`)."""
        if not self.lease_holder:
            return None
        names = [p["metadata"]["name"] for p in self.operators]
        return next((n for n in names if self.lease_holder.rsplit("-", 1)[0] == n), None)


class Observer(Sampler):
    name = "chaos-observer"

    def __init__(self, *, release: Release, t0: float, interval: float = 2.0):
        super().__init__(t0=t0, interval=interval)
        self.release = release
        self.samples: list[Sample] = []
        self.latest = Snapshot()
        self.lives: dict[str, PodLife] = {}
        self.killed: dict[str, float] = {}  #: pods the fault removed -> when

    def mark_killed(self, pod: str) -> None:
        with self._lock:
            self.killed[pod] = time.time()

    def tick(self) -> Snapshot:
        now = time.time()
        cluster, ns = self.release.cluster, self.release.namespace
        items = cluster.kubectl_json("-n", ns, "get", "pods,workerpools,leases", timeout=30).get("items", [])
        workers = [i for i in items if i["kind"] == "Pod" and _selected(i, WORKER_SELECTOR)]
        operators = [i for i in items if i["kind"] == "Pod"
                     and (i["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "operator"]
        pool = next((i for i in items if i["kind"] == "WorkerPool"), {})
        lease = next((i for i in items if i["kind"] == "Lease"), {})
        in_flight = self._in_flight()
        depth = age = dlq = None
        try:
            stats = self._queues()
            depth, age, dlq = stats[0].depth, stats[0].oldest_age_seconds, stats[1].depth
        except Exception as exc:  # noqa: BLE001 - a broker being restarted: a gap in the timeline
            self.errors.append(f"{now - self.t0:.0f}s: queue inspection: {exc}"[:300])
        snap = Snapshot(at=now, workers=workers, operators=operators, pool_status=pool.get("status") or {},
                        lease_holder=(lease.get("spec") or {}).get("holderIdentity"),
                        in_flight=in_flight or {})
        live = snap.live_workers()
        snap.sample = Sample(t=round(now - self.t0, 2), depth=depth, oldest_age_seconds=age, dlq_depth=dlq,
                             replicas=len(live), ready_replicas=len(snap.ready_workers()),
                             desired_replicas=snap.pool_status.get("desiredReplicas"),
                             in_flight=None if in_flight is None else sum(in_flight.values()),
                             restarts=sum(restarts(p) for p in workers))
        with self._lock:
            pod_lives.track(self.lives, workers, now, killed=self.killed)
            self.samples.append(snap.sample)
            self.latest = snap
        return snap

    def _queues(self):
        from .deploy import ledger_modules

        app, _ = ledger_modules()
        urls = self.release.tenancy.host
        stats = inspect_queues(urls.broker, [app.QUEUE, app.DEAD_LETTER_QUEUE], management_url=urls.management)
        return stats[app.QUEUE], stats[app.DEAD_LETTER_QUEUE]

    def _in_flight(self) -> dict[str, int] | None:
        try:
            if self._conn is None or self._conn.closed or self._conn.broken:
                self._conn = psycopg.connect(self.release.tenancy.host.database, autocommit=True, connect_timeout=5)
            # an unfinished attempt whose task started again later died: not in flight
            rows = self._conn.execute(
                "SELECT a.pod, count(*) FROM ledger_attempts a WHERE a.finished_at IS NULL "
                "AND a.started_at > clock_timestamp() - make_interval(secs => %s) "
                "AND NOT EXISTS (SELECT 1 FROM ledger_attempts b WHERE b.task_id = a.task_id AND b.id > a.id) "
                "GROUP BY a.pod", (IN_FLIGHT_HORIZON_SECONDS,)).fetchall()
            return dict(rows)
        except psycopg.Error as exc:
            self.errors.append(f"{time.time() - self.t0:.0f}s: ledger: {exc}"[:300])
            return None

    def pod_lives(self) -> tuple[PodLife, ...]:
        with self._lock:
            return tuple(self.lives.values())

    def wait_tick(self) -> Snapshot:
        """The next snapshot (taken by the thread), for a caller that polls the latest picture."""
        seen = self.latest.at
        deadline = time.monotonic() + self.interval * 5 + 30
        while self.latest.at == seen and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.2)
        return self.latest


def _selected(obj: Mapping[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",")))
