"""One scenario, start to verdict, and a run of many.

A scenario (`Scenario.run`): the steady state before is checked; the load starts (a burst, then a
trickle on both publish paths); when the trigger holds the fault is injected, held for its
duration and ended; the load stops; the runner waits — bounded by the file's recoverySeconds —
until every task sent has its outcome and the steady state after holds (the recovery time is from
the fault's end to that moment); then the checker judges the ledger and the fault's own evidence
is checked. Everything goes to `<run>/<fault>-<broker>/summary.json` and `timeline.png`.

A run (`run`): the cluster is asked what it can host (node access, several nodes, kind), the chaos
services are deployed, and for each broker the ledger is installed once in a namespace of its own
and serves every scenario of that broker (reinstalled when a scenario leaves it unsteady). A
fault the cluster cannot host is excluded with the reason — or fails with it when asked for by name.
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable

from e2e.demo import verdict as demo_verdict
from e2e.demo.timeline import Mark
from e2e.lib import cluster as clusters
from e2e.lib.pytest_plugin import OWNER_ANNOTATION, TEST_LABEL, this_owner
from e2e.lib.waiting import WaitTimeout, wait_for

from . import checker, deploy, ledger
from .actions import ACTIONS, ActionError, Context, Injection
from .nodes import NodeAccessError
from .images import Image
from .observe import Observer
from .report import Outcome, draw_timeline, write_summary
from .spec import FaultSpec
from .steady import steady_problems, unsettled
from .workload import Producer, TaskSpec, Trickle, plan
from .world import Services, Tenancy, claim, release

Log = Callable[[str], None]
#: how long the steady state before a fault may take to hold (a previous scenario's pods settling)
STEADY_BEFORE_SECONDS = 180
#: bound on giving back a scenario's Redis databases, vhost and PostgreSQL database
RELEASE_SECONDS = 90
TRIGGER_SECONDS = 150
#: keys of the poison a fault sends itself are numbered from here, apart from the load's
POISON_NUMBERS_FROM = 90_000


# --- what the cluster can host -------------------------------------------------------------------

def capabilities(cluster: clusters.Cluster) -> dict[str, str | None]:
    """Requirement -> None when this cluster meets it, else the reason it does not."""
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    schedulable = [n["metadata"]["name"] for n in nodes
                   if not any(t.get("effect") == "NoSchedule" for t in n["spec"].get("taints") or [])
                   and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))]
    return {
        "node-access": None if cluster.source in ("local", "kind") else
        f"the {cluster.source} cluster gives no access to its nodes (local cluster or kind needed)",
        "nodes>1": None if len(schedulable) > 1 else
        f"needs more than one schedulable node; this {cluster.source} cluster has {len(schedulable)} "
        f"({', '.join(schedulable) or 'none'}): run it on kind (E2E_CLUSTER=kind)",
        "kind": None if cluster.source == "kind" else f"needs kind (E2E_CLUSTER=kind), this is the {cluster.source} cluster",
        "rabbitmq-cluster": None,
    }


def missing(spec: FaultSpec, caps: dict[str, str | None]) -> str | None:
    reasons = [caps[r] for r in spec.requires if caps.get(r)]
    return "; ".join(reasons) if reasons else None


# --- one scenario -----------------------------------------------------------------------------------

class Scenario:
    def __init__(self, spec: FaultSpec, rel: deploy.Release, services: Services, run_dir: Path, log: Log,
                 *, seed: int | None = None):
        self.spec, self.release, self.services, self.log = spec, rel, services, log
        self.broker = rel.tenancy.broker
        self.folder = run_dir / f"{spec.name}-{self.broker}"
        self.prefix = f"{''.join(w[0] for w in spec.name.split('-'))}{self.broker[0]}-{uuid.uuid4().hex[:5]}"
        self.rng = random.Random(seed)
        self.marks: list[Mark] = []
        self.windows: list[tuple[float, float, str]] = []
        self.failures: list[str] = []
        self.t0 = 0.0
        self._poison_next = POISON_NUMBERS_FROM

    def t(self) -> float:
        return round(time.time() - self.t0, 1)

    def mark(self, kind: str, label: str, at: float | None = None) -> None:
        self.marks.append(Mark(self.t() if at is None else round(at - self.t0, 1), kind, label))

    def poison(self, kind: str, n: int) -> list[TaskSpec]:
        tasks = plan(self.prefix, self.spec.load, self.rng, count=n, start=self._poison_next, poison={kind: n})
        self._poison_next += n
        return tasks

    def run(self) -> tuple[Outcome, deploy.Release]:
        spec, started = self.spec, time.monotonic()
        self.t0 = time.time()
        observer = Observer(release=self.release, t0=self.t0)
        self.log(f"── {spec.name} on {self.broker}: {spec.summary}")
        before = self._await_steady(observer, spec.before, STEADY_BEFORE_SECONDS)
        if before:
            return self._outcome("failed", [f"not steady before the fault: {'; '.join(before)}"], None, None,
                                 started), self.release
        self.t0 = observer.t0 = time.time()  # the timeline starts with the load
        observer.samples.clear()
        observer.start()
        app, _ = deploy.ledger_modules()
        tenancy = self.release.tenancy
        host_app = app.make_app(broker_url=tenancy.host.broker, queue_type=tenancy.queue_type,
                                delivery_counter_url=tenancy.host.delivery_counter)
        producer = Producer(app=host_app, database_url=tenancy.host.database, queue=app.QUEUE, task_name=app.TASK)
        ctx = Context(cluster=self.release.cluster, release=self.release, services=self.services, observer=observer,
                      producer=producer, run_dir=self.folder, log=self.log, poison=self.poison)
        self.folder.mkdir(parents=True, exist_ok=True)
        injection: Injection | None = None
        recovery = None
        try:
            burst = plan(self.prefix, spec.load, self.rng)
            producer.start(burst, Trickle(self.prefix, spec.load, self.rng, start=len(burst)), spec.load.rate,
                           spec.load.outbox_share)
            self.mark("load", f"{len(burst)} tasks, then {spec.load.rate:g}/s")
            injection, fault_end = self._fault(ctx, observer)
            producer.stop()
            recovery = self._await_settled(ctx, observer, producer, fault_end)
        finally:
            producer.stop()
            observer.stop()
        self.release = ctx.release  # an upgrade replaces it
        result = self._check(producer)
        self.failures += result.failures
        if result.lost:
            self.failures.append("where the lost tasks are: " + "; ".join(
                f"{key}: {where}" for key, where in self._whereabouts(producer, result.lost).items()))
        attempts = ledger.attempts(self.release, self.prefix)
        self.failures += expectation_problems(spec.expect, injection=injection, result=result, observer=observer,
                                              attempts=attempts,
                                              release=self.release)
        outcome = self._outcome("failed" if self.failures else "passed", self.failures, result, recovery, started)
        self._write(outcome, result, injection, observer, producer, attempts)
        self.log(f"   {'PASSED' if outcome.ok else 'FAILED'}: {spec.name} on {self.broker}"
                 + (f" — {'; '.join(self.failures)}" if self.failures else "")
                 + f" ({outcome.scenario_seconds:.0f}s)")
        return outcome, self.release

    # --- phases ------------------------------------------------------------------------------------

    def _await_steady(self, observer: Observer, names: Iterable[str], timeout: float) -> list[str]:
        last: list[str] = []

        def problems() -> list[str]:
            nonlocal last
            snap = observer.tick()
            last = steady_problems(names, snap, queue_depth=snap.sample.depth,
                                   outbox_pending=ledger.pending_outbox_rows(self.release),
                                   min_replicas=self.release.min_replicas)
            return last

        try:
            wait_for(f"the steady state {list(names)}", problems, timeout, 2, equals=[], ignoring=ledger.UNAVAILABLE)
            return []
        except WaitTimeout:
            return last or ["timed out"]

    def _fault(self, ctx: Context, observer: Observer) -> tuple[Injection | None, float]:
        spec = self.spec
        kind, value = spec.trigger
        try:
            wait_for(f"the trigger {kind}={value:g}", lambda: _triggered(kind, value, observer, self.t0),
                     TRIGGER_SECONDS, 0.5)
        except WaitTimeout as exc:
            self.failures.append(f"the trigger never held, the fault was not injected: {exc}")
            return None, time.time()
        began = time.time()
        action = ACTIONS[spec.fault.action]
        try:
            injection = action.inject(ctx, spec.fault.target, spec.fault.params)
        except (ActionError, NodeAccessError, clusters.CommandFailed, WaitTimeout) as exc:
            self.failures.append(f"the fault could not be injected: {exc}")
            self.mark("fault", f"{spec.name}: not injected", at=began)
            return None, time.time()
        # The fault holds its duration from when it took effect, at the end of inject(): finding its
        # target takes API calls, which on a busy cluster can take longer than the duration itself.
        start = time.time()
        self.mark("fault", spec.name, at=start)
        self.log(f"   FAULT at {start - self.t0:.1f}s: {injection.what}")
        hold = start + spec.duration - time.time()
        if hold > 0:
            time.sleep(hold)
        if injection.recover is not None:
            try:
                injection.recover()
            except (ActionError, NodeAccessError, clusters.CommandFailed, WaitTimeout) as exc:
                self.failures.append(f"the fault did not end as it should: {exc}")
        end = time.time()
        self.windows.append((round(start - self.t0, 1), round(end - self.t0, 1), spec.name))
        self.log(f"   fault over at {end - self.t0:.1f}s")
        return injection, end

    def _await_settled(self, ctx: Context, observer: Observer, producer: Producer, fault_end: float) -> float | None:
        """Seconds from the fault's end until every task has its outcome and the steady state after
        holds; None (and a failure) when the bound runs out first."""
        last: dict = {}

        def settled() -> bool:
            pg, _, redis_effects = ledger.effects(self.release, self.prefix)
            dead = {d.key for d in ledger.dead_letters(self.release, self.prefix)}
            waiting = unsettled(producer.records(), set(pg) | set(redis_effects), dead)
            snap = observer.wait_tick()
            problems = steady_problems(self.spec.after, snap, queue_depth=snap.sample.depth,
                                       outbox_pending=ledger.pending_outbox_rows(self.release),
                                       min_replicas=self.release.min_replicas)
            last.update(waiting=waiting, problems=problems)
            return not waiting and not problems

        try:
            wait_for("every task settled and the steady state back", settled, self.spec.recovery_seconds, 2,
                     ignoring=ledger.UNAVAILABLE)
        except WaitTimeout:
            waiting = last.get("waiting", [])
            self.failures.append(f"not recovered within {self.spec.recovery_seconds:.0f}s of the fault's end: "
                                 f"{len(waiting)} task(s) without an outcome {waiting[:5]}; "
                                 f"steady state: {'; '.join(last.get('problems', [])) or 'holds'}")
            return None
        self.mark("recovered", "recovered")
        return round(time.time() - fault_end, 1)

    def _check(self, producer: Producer) -> checker.Result:
        pg, duplicates, redis_effects = ledger.effects(self.release, self.prefix)
        return checker.check(producer.records(), checker.effect_counts(pg, duplicates, redis_effects),
                             ledger.attempts(self.release, self.prefix), ledger.dead_letters(self.release, self.prefix))

    def _whereabouts(self, producer: Producer, lost: list[str]) -> dict[str, str]:
        records = {r.key: r for r in producer.records() if r.key in set(lost[:20])}
        sent = {key: f"sent {r.path} at {r.at - self.t0:.1f}s as {r.task_id}" for key, r in records.items()}
        try:
            found = ledger.whereabouts(self.release, {key: r.task_id for key, r in records.items()})
        except ledger.UNAVAILABLE as exc:
            found = {key: f"not searched ({exc!r})" for key in records}
        return {key: f"{sent[key]}; now {found[key]}" for key in records}

    # --- the record ----------------------------------------------------------------------------------

    def _outcome(self, status: str, failures: list[str], result: checker.Result | None, recovery: float | None,
                 started: float) -> Outcome:
        return Outcome(
            fault=self.spec.name, fault_class=self.spec.fault_class, broker=self.broker, status=status,
            reason=failures[0] if failures else "", failures=list(failures),
            lost=len(result.lost) if result else None, duplicated=len(result.duplicated) if result else None,
            unexpected=len(result.unexpected) if result else None,
            recovered=len(result.recovered) if result else None, sent=result.sent if result else None,
            attempts_p50=result.attempts_p50 if result else None, attempts_max=result.attempts_max if result else None,
            recovery_seconds=recovery, scenario_seconds=round(time.monotonic() - started, 1),
            folder=str(self.folder))

    def _write(self, outcome: Outcome, result: checker.Result, injection: Injection | None, observer: Observer,
               producer: Producer, attempts: list[checker.Attempt]) -> None:
        spec = self.spec
        summary = {
            "fault": {"name": spec.name, "class": spec.fault_class, "summary": spec.summary,
                      "action": spec.fault.action, "target": spec.fault.target, "params": dict(spec.fault.params),
                      "trigger": list(spec.trigger), "duration": spec.duration, "load": asdict(spec.load),
                      "steady_state": {"before": spec.before, "after": spec.after}, "expect": spec.expect,
                      "file": str(spec.path) if spec.path else None},
            "broker": self.broker, "queue_type": self.release.tenancy.queue_type,
            "cluster": {"source": self.release.cluster.source, "kubeconfig": self.release.cluster.kubeconfig},
            "namespace": self.release.namespace, "key_prefix": self.prefix,
            "outcome": asdict(outcome),
            "injection": {"what": injection.what, "evidence": injection.evidence} if injection else None,
            "fault_window": self.windows, "marks": [asdict(m) for m in self.marks],
            "checker": result.as_dict(),
            "samples": [asdict(s) for s in observer.samples],
            "pods": [asdict(p) for p in observer.pod_lives()],
            # every attempt (pod, start, end, outcome): the ledger's database goes with the installation
            "attempts": [asdict(a) for a in attempts],
            "observer_errors": observer.errors[-50:], "producer_errors": producer.errors[-50:],
        }
        write_summary(self.folder, summary)
        try:
            draw_timeline(self.folder, observer.samples, self.marks, self.windows,
                          title=f"{spec.name} on {self.broker}: {outcome.status}")
        except Exception as exc:  # noqa: BLE001 - a picture must not hide the verdict
            self.log(f"   (timeline not drawn: {exc!r})")


def _triggered(kind: str, value: float, observer: Observer, t0: float) -> bool:
    snap = observer.latest
    if kind == "afterSeconds":
        return time.time() - t0 >= value
    if kind == "inFlight":
        return sum(snap.in_flight.values()) >= value and snap.busiest_worker() is not None
    desired = snap.pool_status.get("desiredReplicas")
    if desired is None:
        return False
    if kind == "scalingUp":
        # The operator decided on more workers than the pool had when the load began. (Not "more
        # than are Ready": on an idle machine new workers are Ready within a sample or two, and
        # that window can pass unseen.)
        first = observer.samples[0].replicas if observer.samples else None
        return first is not None and desired > first
    # the operator asked for fewer workers than the pool had at its peak: removals under way
    return desired < max((s.replicas for s in observer.samples), default=0)


def expectation_problems(expect: Iterable[str], *, injection: Injection | None, result: checker.Result,
                         observer: Observer, attempts: list[checker.Attempt], release: deploy.Release) -> list[str]:
    """The fault's own evidence (spec.EXPECTATIONS), after the ledger's invariants."""
    evidence = injection.evidence if injection else {}
    samples, min_replicas = observer.samples, release.min_replicas
    problems = []
    for name in expect:
        if name == "attempts-interrupted" and result.interrupted_attempts == 0:
            problems.append("attempts-interrupted: no attempt was cut off: the fault did not hit a running task")
        elif name == "ran-elsewhere" and not ran_elsewhere(attempts, hit_pods(evidence)):
            problems.append(f"ran-elsewhere: no task of the pods hit ({', '.join(hit_pods(evidence)) or 'none'}) "
                            f"ran again on another pod: the fault did not take work away from them")
        elif name == "container-restarted":
            hits = evidence.get("hits", [])
            if not hits or any(h.get("restarts_after", 0) <= h.get("restarts_before", 0) for h in hits):
                problems.append(f"container-restarted: not every hit container restarted: {hits}")
        elif name == "pod-replaced" and not evidence.get("hits"):
            problems.append("pod-replaced: no pod was deleted")
        elif name == "scaled-up" and max((s.replicas for s in samples), default=0) <= min_replicas:
            problems.append(f"scaled-up: the pool never grew past minReplicas {min_replicas}")
        elif name == "scaled-down":
            peak = max((s.replicas for s in samples), default=0)
            final = samples[-1].replicas if samples else None
            if peak <= min_replicas or final != min_replicas:
                problems.append(f"scaled-down: peak {peak} worker(s), {final} at the end (minReplicas {min_replicas})")
        elif name == "idle-first":
            lives = observer.pod_lives()
            demo_attempts = [demo_verdict.Attempt(task_id=a.task_id, key=a.key, task_name="ledger.apply", worker=a.pod,
                                                  started_at=a.started_at, finished_at=a.finished_at,
                                                  outcome=a.outcome) for a in attempts]
            # the operator annotates from busyness it polled up to one interval before the removal
            lag = release.pool["autoscaling"].get("pollIntervalSeconds", 0)
            busy = demo_verdict.busy_removals(lives, demo_attempts, decision_lag=lag)
            removed = {p.pod for p in lives if p.cause == "scale-down"}
            cut = [a.key for a in attempts if a.finished_at is None and a.pod in removed]
            if busy:
                problems.append(f"idle-first: busy worker(s) removed while an idle one stayed: {busy}")
            if cut:
                problems.append(f"idle-first: scale-down cut {len(cut)} running task(s) off: {cut[:5]}")
        elif name == "rolled-out" and "generation" not in evidence:
            problems.append("rolled-out: the worker Deployment did not roll out a new revision")
        elif name == "leader-changed" and not evidence.get("new_lease_holder"):
            problems.append("leader-changed: no other operator took the Lease")
        elif name == "poison-dead-lettered":
            keys = set(evidence.get("keys", []))
            if not keys or keys - set(result.dead_letter_keys):
                problems.append(f"poison-dead-lettered: the fault's poison {sorted(keys)} is not all in the DLQ")
        elif name == "pods-moved" and evidence.get("workers_left_on_node"):
            problems.append(f"pods-moved: workers still on the node: {evidence['workers_left_on_node']}")
    return problems


def hit_pods(evidence: dict) -> list[str]:
    return list(evidence.get("pods") or evidence.get("workers_on_node") or [h["pod"] for h in evidence.get("hits", [])])


def ran_elsewhere(attempts: Iterable[checker.Attempt], pods: Iterable[str]) -> bool:
    """Whether a task that had an attempt on one of `pods` was then attempted on another pod."""
    pods = set(pods)
    by_key: dict[str, list[checker.Attempt]] = {}
    for a in attempts:
        by_key.setdefault(a.key, []).append(a)
    return any(a.pod in pods and any(b.pod not in pods and b.started_at > a.started_at for b in runs)
               for runs in by_key.values() for a in runs)


# --- a run --------------------------------------------------------------------------------------------

def new_namespace(cluster: clusters.Cluster, broker: str, *, quorum: bool) -> str:
    """A namespace of the run's own, labelled like every test namespace (removed with a dead run's)."""
    name = f"chaos-{broker}{'-quorum' if quorum else ''}-{uuid.uuid4().hex[:6]}"
    return cluster.create_namespace(name, {TEST_LABEL: "chaos", "pod-security.kubernetes.io/enforce": "restricted"},
                                    {OWNER_ANNOTATION: this_owner()})


#: log lines per container kept from a failed scenario's namespace
NAMESPACE_LOG_LINES = 2000


class Installation:
    """The ledger of one broker (and queue type) for a run: installed on first use, reinstalled in a
    fresh namespace when a scenario leaves it unsteady, removed at the end."""

    def __init__(self, cluster: clusters.Cluster, services: Services, run_dir: Path, log: Log, *, broker: str,
                 quorum: bool, images: dict[str, Image] | None = None,
                 make_namespace: Callable[[str, bool], str] | None = None):
        self.cluster, self.services, self.run_dir, self.log = cluster, services, run_dir, log
        self.broker, self.quorum, self.images = broker, quorum, images
        #: (broker, quorum) -> a new namespace; the tests pass the harness's, which attaches its trail
        self.make_namespace = make_namespace or (lambda b, q: new_namespace(cluster, b, quorum=q))
        self.release: deploy.Release | None = None
        self.tenancy: Tenancy | None = None

    def get(self) -> deploy.Release:
        if self.release is None:
            namespace = self.make_namespace(self.broker, self.quorum)
            self.tenancy = claim(self.services, owner=namespace, broker=self.broker, quorum=self.quorum)
            self.release = deploy.install(self.cluster, namespace, self.tenancy, self.run_dir, self.log, self.images)
        return self.release

    def save_namespace(self, folder: Path) -> None:
        """After a failure: its pods, events and every container's log (`namespace.txt` in
        `folder`), read before the namespace goes — why a task hung, say, is in the workers' logs,
        not in the verdict."""
        if self.release is None:
            return
        try:
            text = self.cluster.describe_namespace(self.release.namespace, log_lines=NAMESPACE_LOG_LINES)
        except Exception as exc:  # noqa: BLE001 - best effort: the cluster may be what failed
            text = f"not read: {type(exc).__name__}: {exc}"
        (folder / "namespace.txt").write_text(text + "\n")

    def replace(self) -> None:
        """The next get() installs afresh, in a new namespace."""
        self.remove()

    def remove(self) -> None:
        if self.release is None:
            return
        namespace = self.release.namespace
        self.cluster.helm("uninstall", deploy.RELEASE, "--namespace", namespace, "--wait", "--timeout", "180s",
                          check=False, timeout=240)
        self.cluster.delete_namespace(namespace)
        if self.tenancy is not None:
            tenancy = self.tenancy
            try:
                # The way to the services may still be down after a fault (a port-forward to a broker
                # pod that has just restarted, say): try again, and never end the whole run on it.
                wait_for("the scenario's databases and vhost released", lambda: release(self.services, tenancy) or True,
                         RELEASE_SECONDS, 3, ignoring=ledger.UNAVAILABLE)
            except WaitTimeout as exc:
                self.log(f"   (not released: {exc}; removing the services (`python -m e2e.chaos down`) takes them)")
        self.release = self.tenancy = None
