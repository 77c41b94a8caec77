"""`make demo` / `make demo-down`: `.venv/bin/python -m e2e.demo [run|down] [--short] [--broker B]`.

Exit status 0 only when every invariant held (verdict.py); otherwise 1 and the reasons, one a line.
The run folder `runs/<UTC timestamp>/` gets summary.json, timeline.png, the values used and, when
something failed, the cluster's view of it (pods, events, operator log).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from pathlib import Path

import psycopg

from e2e.lib import cluster as clusters
from e2e.services import access
from e2e.services import deploy as services
from e2e.services.forward import ForwardError
from e2e.services.image import ImageError

from . import deploy, environment, ledger, timeline
from .config import BROKERS, DEAD_LETTER_QUEUE, DEFAULT_BROKER, FULL, NAMESPACE, RUNS, SHORT, Plan
from .narrate import Narrator
from .scenario import Outcome, Scenario, ScenarioError, create_schema
from .verdict import Observed, Verdict, attempt_ends, judge


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", default="run", choices=["run", "down"])
    p.add_argument("--short", action="store_true", default=os.environ.get("DEMO_SHORT", "") not in ("", "0"),
                   help="fewer charges and faults (what `make test` runs); env DEMO_SHORT=1")
    p.add_argument("--broker", default=os.environ.get("BROKER") or DEFAULT_BROKER, choices=BROKERS,
                   help=f"env BROKER; default {DEFAULT_BROKER}")
    p.add_argument("--runs-dir", type=Path, default=RUNS, help="where the run folder is created (default runs/)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return down() if args.command == "down" else run(SHORT if args.short else FULL, args.broker, args.runs_dir)


def down() -> int:
    say = Narrator()
    say.phase("make demo-down")
    cluster = clusters.resolve()
    try:
        cluster.check_reachable()
    except clusters.ClusterUnavailable as exc:
        say.say(f"cluster not reachable, nothing to remove there: {str(exc).splitlines()[0]}")
        return 0
    deploy.uninstall(cluster, say.say)
    deploy.delete_namespace(cluster, say.say)
    deployed = services.current(cluster)
    if deployed is None:
        say.say("no in-cluster services: no vhost, database or Redis database to remove")
    else:
        with access.reach(cluster, deployed, log=say.say) as host:
            environment.tear_down(host, say.say)
    say.say("done: the demo's namespace, release, vhost, database, Redis database and pages are gone "
            "(the cluster, the services in taskherd-services and the WorkerPool CRD stay)")
    return 0


def run(plan: Plan, broker: str, runs_dir: Path) -> int:
    started = time.time()
    run_dir = runs_dir / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    run_dir.mkdir(parents=True, exist_ok=True)
    say = Narrator()
    summary: dict = {"plan": dataclasses.asdict(plan), "broker": broker, "run_dir": str(run_dir),
                     "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "timings": {}}
    cluster = scenario = world = None
    verdict: Verdict | None = None
    error: str | None = None
    # the tunnels to the services live until the verdict is written
    forwards = contextlib.ExitStack()
    try:
        say.phase(f"0. Setting up ({plan.name} demo, broker {broker})")
        cluster = deploy.pick_cluster(say.say)
        summary["cluster"] = cluster.source
        deploy.uninstall(cluster, say.say)  # a previous run's pool, so this one starts from rest
        deployed = services.up(cluster, log=say.say)
        host = forwards.enter_context(access.reach(cluster, deployed, log=say.say))
        world = environment.prepare(broker=broker, host=host, pods=deployed.pods, log=say.say)
        say.say(f"services in the cluster, reached by the pods by name: broker {world.pods.broker_url.split('@')[-1]}, "
                f"PostgreSQL, Alertmanager {world.pods.alertmanager_url}")
        deploy.ensure_images(cluster, say.say)
        create_schema(world)
        deploy.install(cluster, world, run_dir, say.say)
        summary["timings"]["setup_seconds"] = round(time.time() - started, 1)

        scenario = Scenario(plan=plan, cluster=cluster, world=world, narrator=say)
        outcome = scenario.run()
        summary["timings"].update({f"{k}_seconds": v for k, v in outcome.phase_seconds.items()})
        verdict = judge_run(scenario, outcome, world)
    except (ScenarioError, deploy.DeployError, services.ServicesError, ImageError,
            ForwardError, clusters.ClusterUnavailable, clusters.CommandFailed, clusters.WaitTimeout) as exc:
        error = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - reported with its traceback, never swallowed
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        if error and verdict is None and scenario is not None and scenario.outcome is not None:
            try:  # a failed run still gets its ledger counted: lost and duplicated so far
                verdict = judge_run(scenario, scenario.outcome, world)
            except Exception as exc:  # noqa: BLE001 - the error above is the story; this is a bonus
                summary["verdict_error"] = f"{type(exc).__name__}: {exc}"
        summary["timings"]["total_seconds"] = round(time.time() - started, 1)
        try:
            write_results(run_dir, summary, scenario, verdict, error, cluster, say)
        finally:
            forwards.close()
    return 0 if verdict is not None and verdict.ok and error is None else 1


def judge_run(scenario: Scenario, outcome: Outcome, world: environment.World) -> Verdict:
    with psycopg.connect(world.host.database_url, autocommit=True) as conn:
        effects, attempts = ledger.read_effects(conn), ledger.read_attempts(conn)
    dead = ledger.read_dead_letters(world.host.broker_url, DEAD_LETTER_QUEUE,
                                    management_url=world.host.management_url)
    samples = scenario.observer.samples
    spec = scenario.observer.latest.pool_spec
    expect = {"scale-up", "scale-down", "kills"} | ({"oom"} if scenario.plan.memory_hog else set()) \
        | ({"alert"} if scenario.plan.poison or scenario.plan.memory_hog else set())
    observed = Observed(
        effects=effects, attempts=attempts, dead_letters=dead, alerts=tuple(outcome.alerts),
        pods=scenario.observer.pod_lives(), min_replicas=spec.get("minReplicas", 1),
        max_replicas_seen=max((s.replicas for s in samples), default=0),
        final_replicas=samples[-1].replicas if samples else None, oom_kills=outcome.oom_kills,
        expect=frozenset(expect))
    scenario.attempts = attempts  # for the timeline's in-flight line
    return judge(outcome.sent, observed)


def write_results(run_dir: Path, summary: dict, scenario: Scenario | None, verdict: Verdict | None,
                  error: str | None, cluster, say: Narrator) -> None:
    outcome = scenario.outcome if scenario else None
    if outcome is not None:
        samples = scenario.observer.samples
        summary["marks"] = [dataclasses.asdict(m) for m in outcome.marks]
        summary["oom"] = outcome.oom_detail
        summary["alerts"] = [a.get("labels") for a in outcome.alerts]
        summary["observer_errors"] = scenario.observer.errors
        summary["samples"] = [dataclasses.asdict(s) for s in samples]
        summary["pods"] = [{"pod": p.pod, "cause": p.cause, "created_t": round(p.created_at - outcome.t0, 1),
                            "removed_t": None if p.removed_at is None else round(p.removed_at - outcome.t0, 1)}
                           for p in scenario.observer.pod_lives()]
        if samples:
            attempts = getattr(scenario, "attempts", None) or _attempts(scenario)
            ends = attempt_ends(attempts)
            in_flight = timeline.in_flight_series(
                [(a.started_at - outcome.t0, ends[a] - outcome.t0) for a in attempts], [s.t for s in samples])
            title = (f"taskherd demo — {summary['broker']}, {len(outcome.sent.charges)} charges, "
                     f"{'PASS' if verdict is not None and verdict.ok and not error else 'FAIL'}")
            summary["timeline"] = str(timeline.render(samples, outcome.marks, in_flight, run_dir / "timeline.png",
                                                      title=title))
    if verdict is not None:
        summary["verdict"] = verdict.as_dict()
    summary["ok"] = verdict is not None and verdict.ok and error is None
    if error:
        summary["error"] = error
        if cluster is not None:
            _dump_cluster(cluster, run_dir)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print_verdict(summary, verdict, error, run_dir, say)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _attempts(scenario: Scenario):
    try:
        return ledger.read_attempts(scenario.conn)
    except Exception:  # noqa: BLE001 - a picture without the in-flight line beats no picture
        return ()


def _dump_cluster(cluster, run_dir: Path) -> None:
    for name, args in {"pods.txt": ("get", "pods,deploy,workerpools", "-n", NAMESPACE, "-o", "wide"),
                       "events.txt": ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
                       "operator.log": ("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=operator",
                                        "--tail=200", "--all-containers", "--prefix"),
                       "workers.log": ("logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=worker",
                                       "--tail=100", "--prefix")}.items():
        try:
            r = cluster.kubectl(*args, check=False, timeout=60)
            (run_dir / name).write_text(r.stdout + r.stderr)
        except Exception:  # noqa: BLE001 - best effort: the cluster may be the thing that failed
            pass


def print_verdict(summary: dict, verdict: Verdict | None, error: str | None, run_dir: Path, say: Narrator) -> None:
    say.phase("The verdict")
    if verdict is not None:
        v = verdict
        print(f"  tasks sent            {v.tasks_sent}")
        print(f"  charges recorded once {v.effects_recorded_once}")
        print(f"  lost                  {len(v.lost)}")
        print(f"  duplicated            {len(v.duplicated)}")
        print("  attempts per charge   " + ", ".join(f"{n}×: {k}" for n, k in v.attempts_per_task.items()))
        print(f"  attempts interrupted  {v.interrupted_attempts} (their process was killed: {v.attempts_cut_by_kills} by the "
              f"force-deletes, the rest OOM; each charge ran again elsewhere)")
        print(f"  pods force-deleted    {v.pods_killed}; OOM kills {v.oom_kills}")
        print(f"  scaled                1 → {v.max_replicas_seen} → {v.final_replicas} pods; removed by scale-down "
              f"{v.pods_removed_by_scale_down}, busy ones among them while an idle one stayed: "
              f"{v.busy_pods_removed_while_idle_existed}")
        print(f"  pages in Alertmanager {v.alerts}")
        print("  dead-letter queue     " + ("\n                        ".join(
            f"{d['task_name']} {d['key']}: {_short(d['reason'], 70)} ({d['attempts']} attempt(s))" for d in v.dlq)
            or "empty"))
    t = summary.get("timings", {})
    print(f"  time                  setup {t.get('setup_seconds', '?')}s, scenario {t.get('scenario_seconds', '?')}s, "
          f"total {t.get('total_seconds', '?')}s")
    print(f"  run folder            {run_dir} (summary.json{', timeline.png' if summary.get('timeline') else ''})")
    problems = (verdict.failures if verdict else []) + ([error] if error else [])
    if problems:
        print("\nDEMO FAILED:")
        for p in problems:
            print(f"  ✗ {p}")
    else:
        print("\nPASS: nothing lost, nothing charged twice, the poison paged, the pool scaled up and back down.")


if __name__ == "__main__":
    sys.exit(main())
