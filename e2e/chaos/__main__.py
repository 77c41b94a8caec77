"""`python -m e2e.chaos run|soak|list|down` — the chaos suite's command line (docs/chaos.md).

    run   [--broker redis|rabbitmq|all] [--fault NAME]... [--subset] [--update-docs] [--seed N]
    matrix RUN_DIR... [--update-docs]   one matrix from the summaries of several runs (the latest
          of each fault on each broker wins), with what this cluster cannot host marked excluded
    soak  [--broker redis|rabbitmq] [--tasks N] [--faults N] [--rate PER_SECOND] [--seed N]
    list  the fault files, and which of them this cluster can host
    down  remove the chaos services and any namespace a chaos run left

Exit status: 0 when every scenario passed (excluded ones do not fail a run), 1 otherwise, 2 for a
usage error or a bad fault file.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from e2e.lib import cluster as clusters

from . import report, spec as specs
from .runner import capabilities, missing

RUNS = Path(__file__).resolve().parents[2] / "runs"


def _logger(started: float):
    def log(message: str) -> None:
        print(f"{time.monotonic() - started:7.1f}s {message}", flush=True)
    return log


def _cluster(log) -> clusters.Cluster:
    cluster = clusters.resolve()
    cluster.check_reachable(timeout=60)
    log(f"cluster: {cluster.source} ({cluster.kubeconfig})")
    return cluster


def _brokers(choice: str) -> tuple[str, ...]:
    return specs.BROKERS if choice == "all" else (choice,)


def cmd_run(args, log) -> int:
    from . import suite

    chosen = specs.select(specs.load_all(), args.fault)
    if args.subset:
        chosen = [s for s in chosen if s.subset]
    cluster = _cluster(log)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run_dir = RUNS / f"chaos-{stamp}"
    started = time.monotonic()
    outcomes = suite.run(cluster, chosen, brokers=_brokers(args.broker), run_dir=run_dir, log=log,
                         named=bool(args.fault), seed=args.seed, keep=args.keep)
    minutes = (time.monotonic() - started) / 60
    title = (f"{stamp[:8]} on the {cluster.source} cluster "
             f"({len(cluster.node_names())} node(s)), {minutes:.0f} min")
    markdown = report.matrix_markdown(outcomes, title=title)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "matrix.md").write_text(markdown)
    print("\n== chaos matrix ==\n" + report.matrix_text(outcomes) + f"\n\n{run_dir / 'matrix.md'}", flush=True)
    if args.update_docs:
        report.update_docs(markdown)
        print(f"docs/chaos.md: matrix updated ({title})")
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print(f"CHAOS FAILED: {len(failed)} scenario(s): " + ", ".join(f"{o.fault}/{o.broker}" for o in failed))
        return 1
    return 0


def cmd_soak(args, log) -> int:
    from . import soak

    cluster = _cluster(log)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = soak.run(cluster, specs.load_all(), broker=args.broker, tasks=args.tasks, faults=args.faults,
                      rate=args.rate, run_dir=RUNS / f"chaos-soak-{stamp}", log=log, seed=args.seed)
    print("\n== chaos soak ==\n" + soak.describe(result), flush=True)
    return 0 if result["ok"] else 1


def cmd_matrix(args, log) -> int:
    import json

    folders = [Path(d) for d in args.run_dirs]
    summaries = [json.loads(path.read_text()) for folder in folders for path in sorted(folder.glob("*/summary.json"),
                                                                                     key=lambda p: p.stat().st_mtime)]
    if not summaries:
        print(f"chaos: no */summary.json in {', '.join(map(str, folders))}", file=sys.stderr)
        return 2
    outcomes = report.outcomes_from_summaries(summaries)
    cluster = _cluster(log)
    caps = capabilities(cluster)
    ran = {(o.fault, o.broker) for o in outcomes}
    for s in specs.load_all():
        why = missing(s, caps)
        outcomes += [report.Outcome(s.name, s.fault_class, b, "excluded" if why else "not run", reason=why or "")
                     for b in s.brokers if (s.name, b) not in ran]
    minutes = sum(o.scenario_seconds or 0 for o in outcomes) / 60
    title = (f"{', '.join(sorted({f.name.split('-')[-1][:8] for f in folders}))} on the {cluster.source} cluster "
             f"({len(cluster.node_names())} node(s)): {', '.join(f.name for f in folders)}; "
             f"{minutes:.0f} min of scenarios")
    markdown = report.matrix_markdown(outcomes, title=title)
    print(markdown)
    if args.update_docs:
        report.update_docs(markdown)
        print(f"docs/chaos.md: matrix updated ({title})")
    return 0 if all(o.ok for o in outcomes) else 1


def cmd_list(args, log) -> int:
    cluster = clusters.resolve()
    try:
        cluster.check_reachable(timeout=10)
        caps = capabilities(cluster)
    except clusters.ClusterUnavailable as exc:
        caps, log_line = None, f"(cluster unreachable: {exc})"
        print(log_line)
    for s in specs.load_all():
        why = missing(s, caps) if caps else None
        print(f"{s.name:<32} {s.fault_class:<14} {','.join(s.brokers):<15} "
              f"{'subset ' if s.subset else '       '}{'excluded: ' + why if why else ''}")
    return 0


def cmd_down(args, log) -> int:
    from . import world
    from e2e.lib.pytest_plugin import TEST_LABEL

    cluster = _cluster(log)
    for ns in cluster.kubectl_json("get", "namespaces", "-l", f"{TEST_LABEL} in (chaos, chaos-test)")["items"]:
        cluster.delete_namespace(ns["metadata"]["name"])
        log(f"namespace {ns['metadata']['name']} deleted")
    world.down(cluster, log)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the fault matrix")
    run.add_argument("--broker", choices=("redis", "rabbitmq", "all"), default="all")
    run.add_argument("--fault", action="append", default=[], metavar="NAME", help="only this fault (repeatable)")
    run.add_argument("--subset", action="store_true", help="only the faults marked `subset: true` (make test)")
    run.add_argument("--update-docs", action="store_true", help="write the matrix into docs/chaos.md")
    run.add_argument("--seed", type=int, default=None, help="seed of the workload's random choices")
    run.add_argument("--keep", action="store_true", help="leave the last installation in place (and a failed "
                                                         "one: no reinstall), to look at")
    soak = sub.add_parser("soak", help="random faults against a continuous load")
    soak.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    soak.add_argument("--tasks", type=int, default=10_000)
    soak.add_argument("--faults", type=int, default=50)
    soak.add_argument("--rate", type=float, default=6.0, help="tasks per second")
    soak.add_argument("--seed", type=int, default=None)
    matrix = sub.add_parser("matrix", help="one matrix from the summaries of several runs")
    matrix.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs/chaos-<time> folders, oldest first")
    matrix.add_argument("--update-docs", action="store_true", help="write the matrix into docs/chaos.md")
    sub.add_parser("list", help="the fault files and what this cluster can host")
    sub.add_parser("down", help="remove the chaos services and leftover chaos namespaces")
    args = parser.parse_args(argv)
    log = _logger(time.monotonic())
    try:
        return {"run": cmd_run, "soak": cmd_soak, "matrix": cmd_matrix, "list": cmd_list,
                "down": cmd_down}[args.command](args, log)
    except specs.SpecError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
