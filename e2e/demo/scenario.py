"""The story the demo tells, phase by phase, and the faults it causes along the way.

A burst of charges; the operator scales the pool up on depth and age; worker pods are force-deleted
mid-task; a report outgrows its memory limit; an invalid charge is dead-lettered and paged; the
backlog drains; a trickle keeps a few workers busy while the pool scales back down, so that the
operator has to choose idle pods. Every step is narrated; the verdict comes after (verdict.py).
"""
from __future__ import annotations

import datetime as dt
import sys
import time
import uuid
from dataclasses import dataclass, field

import httpx
import psycopg

from e2e.lib import cluster as clusters

from . import ledger
from .config import DEAD_LETTER_QUEUE, NAMESPACE, QUEUE, SHOP, Plan
from .environment import World
from .narrate import Narrator
from .observe import Observer
from .timeline import Mark
from .verdict import DeadLetter, Sent, attempt_ends, running_at

ALERT_NAME = "TaskherdDeadLetterQueue"


class ScenarioError(RuntimeError):
    """A phase did not reach its goal in time; the message says which and what was last seen."""


@dataclass
class Outcome:
    sent: Sent
    t0: float
    marks: list[Mark] = field(default_factory=list)
    alerts: list[dict] = field(default_factory=list)
    oom_kills: int = 0
    oom_detail: str = ""
    errors: list[str] = field(default_factory=list)
    phase_seconds: dict[str, float] = field(default_factory=dict)


def producer(world: World):
    """The shop's own Celery app, on the host's side of the broker: what a web server would publish with."""
    if str(SHOP) not in sys.path:
        sys.path.insert(0, str(SHOP))
    import os

    os.environ["TASKHERD_BROKER_URL"] = world.host.broker_url  # shop.app builds its module-level app from it
    os.environ.setdefault("TASKHERD_DELIVERY_COUNTER_URL", world.host.delivery_counter_url)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from shop.app import make_app

        return make_app(broker_url=world.host.broker_url, queue=QUEUE)


def create_schema(world: World) -> None:
    if str(SHOP) not in sys.path:
        sys.path.insert(0, str(SHOP))
    import os

    os.environ.setdefault("TASKHERD_BROKER_URL", world.host.broker_url)
    from shop import db

    with psycopg.connect(world.host.database_url, autocommit=True) as conn:
        db.create_schema(conn)


def alerts_since(alertmanager_url: str, since: float) -> list[dict]:
    """The demo namespace's DLQ alerts Alertmanager received (or updated) since `since`."""
    r = httpx.get(f"{alertmanager_url}/api/v2/alerts", timeout=10)
    r.raise_for_status()
    found = []
    for a in r.json():
        labels = a.get("labels") or {}
        updated = a.get("updatedAt") or a.get("startsAt")
        if (labels.get("alertname") == ALERT_NAME and labels.get("namespace") == NAMESPACE
                and updated and dt.datetime.fromisoformat(updated.replace("Z", "+00:00")).timestamp() >= since - 2):
            found.append(a)
    return found


class Scenario:
    def __init__(self, *, plan: Plan, cluster: clusters.Cluster, world: World, narrator: Narrator):
        self.plan, self.cluster, self.world, self.say = plan, cluster, world, narrator
        self.run_id = uuid.uuid4().hex[:4]
        self.charges = [f"ch-{self.run_id}-{i:04d}" for i in range(plan.charges)]
        self.poison = (f"ch-{self.run_id}-invalid",) if plan.poison else ()
        self.hogs = (f"report-{self.run_id}-huge",) if plan.memory_hog else ()
        self.trickle: list[str] = []
        self.app = producer(world)
        self.conn = psycopg.connect(world.host.database_url, autocommit=True)
        self.observer: Observer | None = None
        self.outcome: Outcome | None = None
        self._kills_done = 0
        self._last_kill = 0.0
        self._first_dead_letter_at: float | None = None
        self._dead_letters_told: set[str] = set()
        self._removals_told: set[str] = set()
        self._last_status = 0.0

    # ---- helpers
    def t(self) -> float:
        return time.time() - self.outcome.t0

    def mark(self, kind: str, label: str) -> None:
        self.outcome.marks.append(Mark(round(self.t(), 1), kind, label))

    def send_charge(self, charge_id: str, amount_cents: int) -> None:
        self.app.send_task("shop.charge", kwargs={"charge_id": charge_id, "customer": f"cust-{hash(charge_id) % 40:02d}",
                                                  "amount_cents": amount_cents}, queue=QUEUE)

    def effects(self) -> dict[str, int]:
        return ledger.read_effects(self.conn)

    # ---- phases
    def wait_steady(self, timeout: float = 180) -> None:
        """The pool at minReplicas, ready, and the operator observing the (empty) queue."""
        deadline = time.monotonic() + timeout
        snap = None
        while time.monotonic() < deadline:
            snap = self.observer.tick()
            s, minimum = snap.sample, snap.pool_spec.get("minReplicas", 1)
            if (s.ready_replicas == s.replicas == minimum and s.depth == 0
                    and any(c.get("type") == "Ready" and c.get("status") == "True"
                            for c in snap.pool_status.get("conditions") or [])):
                return
            time.sleep(1)
        raise ScenarioError(f"the pool did not settle at minReplicas with an empty queue in {timeout:.0f}s; "
                            f"last seen: {snap.sample if snap else None}, status {snap.pool_status if snap else None}")

    def run(self) -> Outcome:
        t_start = time.time()
        self.observer = Observer(cluster=self.cluster, database_url=self.world.host.database_url, t0=t_start)
        self.outcome = Outcome(sent=Sent(charges=(), poison=self.poison, memory_hogs=self.hogs), t0=t_start)
        self.say.phase("1. The pool at rest")
        self.wait_steady()
        pool = self.observer.latest.pool_spec
        self.say.say(f"WorkerPool: min {pool.get('minReplicas')} / max {pool.get('maxReplicas')} workers, "
                     f"{pool.get('targetDepthPerWorker')} messages per worker, oldest message at most "
                     f"{pool.get('maxOldestMessageAgeSeconds')}s, polled every {pool.get('pollIntervalSeconds')}s")
        self.outcome.phase_seconds["steady"] = round(time.time() - t_start, 1)

        self.say.phase(f"2. A burst of {len(self.charges)} charges")
        self.outcome.t0 = self.say.t0 = self.observer.t0 = time.time()
        self.observer.samples.clear()
        self.observer.start()
        for i, charge_id in enumerate(self.charges):
            self.send_charge(charge_id, 500 + i)
        for charge_id in self.poison:
            self.send_charge(charge_id, -500)
        self.outcome.sent = Sent(charges=tuple(self.charges), poison=self.poison, memory_hogs=self.hogs)
        self.mark("burst", f"{len(self.charges)} charges")
        self.say.say(f"sent {len(self.charges)} charges and {len(self.poison)} invalid one (amount −500) "
                     f"in {self.t():.1f}s")
        self._watch_burst()
        self.outcome.phase_seconds["burst"] = round(self.t(), 1)

        self.say.phase("3. The backlog is gone: the pool scales down, idle workers first")
        self._scale_down()
        self.outcome.phase_seconds["scenario"] = round(self.t(), 1)
        self.observer.stop()
        self.outcome.sent = Sent(charges=tuple(self.charges + self.trickle), poison=self.poison,
                                 memory_hogs=self.hogs)
        self.outcome.errors += self.observer.errors
        return self.outcome

    def _watch_burst(self) -> None:
        hog_sent = False
        deadline = time.monotonic() + self.plan.drain_timeout
        while True:
            time.sleep(self.observer.interval)
            self._check_sight()
            snap = self.observer.latest
            effects = self.effects()
            if self.hogs and not hog_sent and self.t() >= 4:
                for report_id in self.hogs:
                    self.app.send_task("shop.build_report", kwargs={"report_id": report_id,
                                                                    "megabytes": self.plan.hog_megabytes}, queue=QUEUE)
                hog_sent = True
                self.say.say(f"sent report {self.hogs[0]} that needs {self.plan.hog_megabytes} MiB "
                             f"(the worker's memory limit is far lower)")
            self._narrate(snap, effects, len(self.charges))
            self._maybe_kill(snap)
            self._check_oom()
            self._check_dead_letters()
            self._check_alert()
            recorded = all(effects.get(c) for c in self.charges)
            dead = {d.key for d in self._dead_letters()} if recorded else set()
            if recorded and set(self.poison) | set(self.hogs) <= dead and snap.sample.depth == 0 \
                    and self._kills_done >= self.plan.kills:
                self.mark("drained", "backlog drained")
                self.say.say(f"every charge recorded, the backlog is empty ({self.t():.0f}s after the burst)")
                return
            if time.monotonic() > deadline:
                missing = [c for c in self.charges if not effects.get(c)]
                raise ScenarioError(f"the burst did not settle in {self.plan.drain_timeout:.0f}s: {len(missing)} "
                                    f"charges unrecorded (e.g. {missing[:3]}), depth {snap.sample.depth}, "
                                    f"dead letters {[d.key for d in self._dead_letters()]}, "
                                    f"kills {self._kills_done}/{self.plan.kills}")

    def _scale_down(self) -> None:
        minimum = self.observer.latest.pool_spec.get("minReplicas", 1)
        n = int(self.plan.trickle_seconds / self.plan.trickle_interval)
        self.say.say(f"a trickle of {n} charges, one every {self.plan.trickle_interval:.0f}s, keeps a few workers "
                     f"busy while the operator removes the others")
        next_send, sent = time.monotonic(), 0
        deadline = time.monotonic() + self.plan.trickle_seconds + self.plan.scale_down_timeout
        while True:
            if sent < n and time.monotonic() >= next_send:
                charge_id = f"ch-{self.run_id}-late-{sent:02d}"
                self.send_charge(charge_id, 900 + sent)
                self.trickle.append(charge_id)
                sent += 1
                next_send += self.plan.trickle_interval
            time.sleep(0.5)
            self._check_sight()
            snap = self.observer.latest
            if time.time() - self._last_status >= self.observer.interval:
                effects = self.effects()
                self._narrate(snap, effects, len(self.charges) + len(self.trickle))
                self._check_alert()
                removed = [life.pod for life in self.observer.pod_lives()
                           if life.cause == "scale-down" and life.pod not in self._removals_told]
                if removed:
                    self._removals_told.update(removed)
                    # judged exactly as the verdict does: from the ledger, at the moment of removal
                    lives = {life.pod: life for life in self.observer.pod_lives()}
                    ends = attempt_ends(ledger.read_attempts(self.conn))
                    at = min(lives[p].removed_at for p in removed)
                    busy = [p for p in removed if running_at(p, lives[p].removed_at, ends)]
                    stayed = [name for name, life in lives.items() if life.removed_at is None]
                    stayed_idle = [p for p in stayed if not running_at(p, at, ends)]
                    self.mark("scale", f"scale-down: -{len(removed)} pods")
                    self.say.say(f"the operator scaled down: {len(removed)} pod(s) removed, "
                                 f"{len(removed) - len(busy)} idle, {len(busy)} busy; {len(stayed)} stayed, "
                                 f"{len(stayed_idle)} of them idle at that moment"
                                 + (" (busy pods finish their tasks in the preStop drain before they go)" if busy else ""))
                    self.say.say(f"operator: {snap.pool_status.get('lastScaleReason') or '?'}")
                s = snap.sample
                if (sent == n and all(effects.get(c) for c in self.trickle) and s.replicas == minimum
                        and s.desired_replicas == minimum and (self.outcome.alerts or not (self.poison or self.hogs))):
                    self.say.say(f"back at {minimum} worker(s), every late charge recorded")
                    return
            if time.monotonic() > deadline:
                raise ScenarioError(f"the pool did not scale back to {minimum} in time: "
                                    f"{snap.sample}, operator: {snap.pool_status.get('lastDecisionReason')}")

    def _check_sight(self) -> None:
        """The watch must be current: a cluster that went away is the reason, not a stuck backlog."""
        stale = time.time() - self.observer.latest.at
        if stale > 30:
            raise ScenarioError(f"lost sight of the cluster for {stale:.0f}s (was it restarted or stopped?); "
                                f"last errors: {self.observer.errors[-3:]}")

    # ---- narration and faults
    def _narrate(self, snap, effects: dict[str, int], expected: int) -> None:
        self._last_status = time.time()
        in_flight = sum(snap.in_flight.values())
        reason = snap.pool_status.get("lastDecisionReason")
        self.say.status(snap.sample, in_flight=in_flight, effects=sum(1 for v in effects.values() if v),
                        expected=expected, reason=reason)

    def _maybe_kill(self, snap) -> None:
        if self._kills_done >= self.plan.kills or self.t() < 10:
            return
        if time.time() - self._last_kill < self.plan.seconds_between_kills:
            return
        ready = {p["metadata"]["name"] for p in snap.pods if not p["metadata"].get("deletionTimestamp")
                 and any(c.get("type") == "Ready" and c.get("status") == "True"
                         for c in (p.get("status") or {}).get("conditions") or [])}
        busy = sorted(((n, pod) for pod, n in snap.in_flight.items() if pod in ready), reverse=True)
        if len(ready) < 2 or not busy:  # kill one worker among others, as a node failure would
            return
        n, pod = busy[0]
        self.cluster.kubectl("delete", "pod", pod, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false",
                             check=False, timeout=30)
        self.observer.mark_killed(pod, time.time())
        self._kills_done += 1
        self._last_kill = time.time()
        self.mark("kill", f"force-delete {pod.rsplit('-', 1)[-1]}")
        self.say.say(f"FAULT: force-deleted worker pod {pod} with {n} charge(s) in flight "
                     f"({self._kills_done}/{self.plan.kills})")

    def _hog_attempts(self):
        rows = self.conn.execute("SELECT worker, extract(epoch FROM started_at)::float8, finished_at IS NULL "
                                 "FROM shop_attempts WHERE task_name = 'shop.build_report' ORDER BY id").fetchall()
        return rows

    def _check_oom(self) -> None:
        if not self.hogs or self.outcome.oom_detail:
            return
        rows = self._hog_attempts()
        if len(rows) < 2 and not any(d.key in self.hogs for d in self._dead_letters()):
            return
        counters = {w: self.cluster.oom_kills(NAMESPACE, w) for w in dict.fromkeys(r[0] for r in rows)}
        statuses = sorted({pod for pod, _ in self.observer.oom_killed_containers})
        self.outcome.oom_kills = max(sum(c or 0 for c in counters.values()), len(statuses))
        self.outcome.oom_detail = ("memory cgroup oom_kill counters: "
                                   + ", ".join(f"{w}={'gone' if c is None else c}" for w, c in counters.items())
                                   + (f"; OOMKilled containers: {statuses}" if statuses else ""))
        self.mark("oom", "report OOM-killed")
        self.say.say(f"FAULT: the report outgrew its memory limit: the kernel OOM-killed the process running it "
                     f"({self.outcome.oom_detail}); the message came back, {len(rows)} deliveries so far")

    def _dead_letters(self) -> tuple[DeadLetter, ...]:
        return ledger.read_dead_letters(self.world.host.broker_url, DEAD_LETTER_QUEUE,
                                        management_url=self.world.host.management_url)

    def _check_dead_letters(self) -> None:
        depth = self.observer.latest.sample.dlq_depth
        if not depth or len(self._dead_letters_told) >= len(self.poison) + len(self.hogs):
            return
        for d in self._dead_letters():
            if d.key not in self._dead_letters_told:
                self._dead_letters_told.add(d.key)
                self._first_dead_letter_at = self._first_dead_letter_at or time.time()
                self.mark("poison", f"DLQ: {d.task_name}")
                self.say.say(f"DEAD-LETTERED: {d.task_name} {d.key} after {d.attempts} attempt(s): {d.reason}")

    def _check_alert(self) -> None:
        if self.outcome.alerts or self._first_dead_letter_at is None:
            return
        alerts = alerts_since(self.world.host.alertmanager_url, self.outcome.t0)
        if alerts:
            self.outcome.alerts = alerts
            labels = alerts[0]["labels"]
            self.mark("alert", "page in Alertmanager")
            self.say.say(f"PAGED: Alertmanager has {labels['alertname']} for {labels.get('namespace')}/"
                         f"{labels.get('pool')} queue {labels.get('queue')} "
                         f"({time.time() - self._first_dead_letter_at:.0f}s after the first dead letter): "
                         f"{(alerts[0].get('annotations') or {}).get('summary', '')}")
        elif time.time() - self._first_dead_letter_at > self.plan.alert_timeout:
            raise ScenarioError(f"no page in Alertmanager {self.plan.alert_timeout:.0f}s after the first dead letter; "
                                f"WorkerPool conditions: {self.observer.latest.pool_status.get('conditions')}")
