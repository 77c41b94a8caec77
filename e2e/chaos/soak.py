"""`make chaos-soak`: random faults from the matrix against one continuous load, then one verdict.

One installation of the ledger on one broker; a trickle of short tasks on both publish paths at a
steady rate; one fault after another, drawn at random from the fault files this cluster can host
(each injected and ended as its file says, its trigger aside: the load is always there), until at
least `faults` faults were injected and `tasks` tasks sent. Then the load stops, every task must
reach its outcome, and the checker judges the whole ledger: lost 0, duplicated 0, unexpected 0.

Per fault the soak measures the recovery: from the fault's end until every worker is Ready and the
oldest waiting message is again younger than the pool's maxOldestMessageAgeSeconds.
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from e2e.demo.timeline import Mark
from e2e.lib import cluster as clusters
from e2e.lib.waiting import WaitTimeout, wait_for

from . import checker, deploy, ledger
from .actions import ACTIONS, ActionError, Context
from .images import pinned
from .nodes import NodeAccessError
from .observe import Observer
from .report import draw_timeline, write_summary
from .runner import POISON_NUMBERS_FROM, Installation, capabilities, missing
from .spec import FaultSpec, Load
from .steady import unsettled
from .suite import needs_quorum
from .workload import Producer, Trickle, plan
from .world import services

Log = Callable[[str], None]
#: the soak's tasks: short, so that the load is many tasks rather than long ones
SOAK_LOAD = Load(tasks=0, rate=5.0, outbox_share=0.5, durations=(0.1, 0.2, 0.5, 1.0), permanent=0)
STEADY_SECONDS = 240
SETTLE_SECONDS = 900


def eligible(specs: list[FaultSpec], broker: str, caps: dict[str, str | None]) -> list[FaultSpec]:
    """The faults a soak may draw on this broker and cluster: not the scale-down scenario (it needs a
    load that rises and falls), not the RabbitMQ-cluster one (another installation), and on RabbitMQ
    not the unwritable DLQ (its policy needs an empty DLQ, and a soak's DLQ fills)."""
    return [s for s in specs if broker in s.brokers and not missing(s, caps) and not needs_quorum(s)
            and s.fault.action != "operator-scale-down"
            and not (s.fault.action == "dlq-unwritable" and broker == "rabbitmq")]


def run(cluster: clusters.Cluster, specs: list[FaultSpec], *, broker: str, tasks: int, faults: int, rate: float,
        run_dir: Path, log: Log, seed: int | None = None) -> dict:
    rng = random.Random(seed)
    pool = eligible(specs, broker, capabilities(cluster))
    if not pool:
        raise ActionError(f"no fault of the matrix can run on the {cluster.source} cluster with {broker}")
    log(f"soak on {broker}: at least {tasks} tasks at {rate:g}/s and {faults} faults drawn from "
        f"{', '.join(s.name for s in pool)}")
    load = Load(**{**asdict(SOAK_LOAD), "rate": rate})
    prefix = f"soak{broker[0]}-{uuid.uuid4().hex[:5]}"
    poison_next = [POISON_NUMBERS_FROM * 10]

    def poison(kind: str, n: int):
        tasks_ = plan(prefix, load, rng, count=n, start=poison_next[0], poison={kind: n})
        poison_next[0] += n
        return tasks_

    images = pinned(cluster, log)
    with services(cluster, quorum=False, log=log) as deployed:
        installation = Installation(cluster, deployed, run_dir, log, broker=broker, quorum=False, images=images)
        try:
            release = installation.get()
            t0 = time.time()
            observer = Observer(release=release, t0=t0, interval=3.0).start()
            app, _ = deploy.ledger_modules()
            host_app = app.make_app(broker_url=release.tenancy.host.broker,
                                    delivery_counter_url=release.tenancy.host.delivery_counter)
            producer = Producer(app=host_app, database_url=release.tenancy.host.database, queue=app.QUEUE,
                                task_name=app.TASK)
            ctx = Context(cluster=cluster, release=release, services=deployed, observer=observer, producer=producer,
                          run_dir=run_dir, log=log, poison=poison)
            producer.start([], Trickle(prefix, load, rng, start=0), rate, load.outbox_share)
            marks: list[Mark] = []
            windows: list[tuple[float, float, str]] = []
            injected: list[dict] = []
            try:
                while len(injected) < faults or len(producer.records()) < tasks:
                    spec = rng.choice(pool)
                    injected.append(_one_fault(ctx, spec, t0, marks, windows, log))
                    log(f"   {len(injected)} fault(s), {len(producer.records())} task(s) sent")
                    time.sleep(rng.uniform(5, 15))
            finally:
                producer.stop()
            settle_problem = _settle(ctx, producer, prefix)
            observer.stop()
            pg, duplicates, redis_effects = ledger.effects(ctx.release, prefix)
            result = checker.check(producer.records(), checker.effect_counts(pg, duplicates, redis_effects),
                                   ledger.attempts(ctx.release, prefix), ledger.dead_letters(ctx.release, prefix))
            failures = result.failures + ([settle_problem] if settle_problem else []) + [
                f"{f['fault']}: {f['error']}" for f in injected if f.get("error")]
            recoveries = [f["recovery_seconds"] for f in injected if f.get("recovery_seconds") is not None]
            summary = {
                "broker": broker, "cluster": cluster.source, "key_prefix": prefix, "rate": rate,
                "tasks": result.sent, "faults": len(injected), "lost": len(result.lost),
                "duplicated": len(result.duplicated), "unexpected": len(result.unexpected),
                "recovered": len(result.recovered), "worst_recovery_seconds": max(recoveries, default=None),
                "faults_by_name": _count(f["fault"] for f in injected), "minutes": round((time.time() - t0) / 60, 1),
                "ok": not failures, "failures": failures, "checker": result.as_dict(), "injected": injected,
                "samples": [asdict(s) for s in observer.samples], "observer_errors": observer.errors[-50:],
                "producer_errors": producer.errors[-50:],
            }
            write_summary(run_dir, summary)
            if failures:
                installation.save_namespace(run_dir)
            draw_timeline(run_dir, observer.samples, marks, windows, title=f"soak on {broker}: "
                          f"{result.sent} tasks, {len(injected)} faults")
            return summary
        finally:
            installation.remove()


def _one_fault(ctx: Context, spec: FaultSpec, t0: float, marks: list[Mark], windows: list, log: Log) -> dict:
    record: dict = {"fault": spec.name}
    try:
        wait_for("every worker Ready before the next fault", lambda: _serving(ctx, ready_only=True),
                 STEADY_SECONDS, 2, ignoring=ledger.UNAVAILABLE)
    except WaitTimeout as exc:
        record["error"] = f"not steady before the fault: {exc}"
        return record
    start = time.time()
    try:
        injection = ACTIONS[spec.fault.action].inject(ctx, spec.fault.target, spec.fault.params)
        log(f"   FAULT {spec.name} at {start - t0:.0f}s: {injection.what}")
        marks.append(Mark(round(start - t0, 1), "fault", spec.name))
        hold = start + spec.duration - time.time()
        if hold > 0:
            time.sleep(hold)
        if injection.recover:
            injection.recover()
        record["evidence"] = injection.evidence
    except (ActionError, NodeAccessError, clusters.CommandFailed, WaitTimeout) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        log(f"   {spec.name}: {record['error']}")
    end = time.time()
    windows.append((round(start - t0, 1), round(end - t0, 1), spec.name))
    record.update(start=round(start - t0, 1), end=round(end - t0, 1))
    try:
        wait_for(f"service back after {spec.name}", lambda: _serving(ctx, ready_only=False), STEADY_SECONDS, 1,
                 ignoring=ledger.UNAVAILABLE)
        record["recovery_seconds"] = round(time.time() - end, 1)
        marks.append(Mark(round(time.time() - t0, 1), "recovered", "recovered"))
    except WaitTimeout as exc:
        record["error"] = record.get("error") or f"not back to service within {STEADY_SECONDS}s: {exc}"
    return record


def _serving(ctx: Context, *, ready_only: bool) -> bool:
    """Every worker Ready (as many as the WorkerPool wants) and, unless ready_only, the oldest waiting
    message younger than the pool's age target: the fleet serves the load as it should."""
    snap = ctx.observer.wait_tick()
    live, ready = snap.live_workers(), snap.ready_workers()
    desired = snap.pool_status.get("desiredReplicas")
    if not live or len(ready) != len(live) or desired not in (None, len(live)):
        return False
    if ready_only:
        return True
    limit = ctx.release.pool["autoscaling"]["maxOldestMessageAgeSeconds"]
    age = snap.sample.oldest_age_seconds if snap.sample else None
    return snap.sample is not None and snap.sample.depth is not None and (age or 0) <= limit


def _settle(ctx: Context, producer: Producer, prefix: str) -> str | None:
    last: list[str] = []

    def done() -> bool:
        nonlocal last
        pg, _, redis_effects = ledger.effects(ctx.release, prefix)
        dead = {d.key for d in ledger.dead_letters(ctx.release, prefix)}
        last = unsettled(producer.records(), set(pg) | set(redis_effects), dead)
        return not last

    try:
        wait_for("every task of the soak settled", done, SETTLE_SECONDS, 5, ignoring=ledger.UNAVAILABLE)
        return None
    except WaitTimeout:
        return f"{len(last)} task(s) without an outcome {SETTLE_SECONDS}s after the load stopped: {last[:5]}"


def _count(names) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def describe(summary: dict) -> str:
    return (f"  broker {summary['broker']} on the {summary['cluster']} cluster, {summary['minutes']} min\n"
            f"  tasks {summary['tasks']}, faults {summary['faults']} ({summary['faults_by_name']})\n"
            f"  lost {summary['lost']}, duplicated {summary['duplicated']}, unexpected {summary['unexpected']}, "
            f"recovered {summary['recovered']}, worst recovery {summary['worst_recovery_seconds']} s\n"
            f"  verdict: {'PASSED' if summary['ok'] else 'FAILED: ' + '; '.join(summary['failures'])}")
