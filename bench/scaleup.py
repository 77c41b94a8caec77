"""Scale-up on the local cluster: from the scale call to new pods Ready and taking tasks, with a breakdown.

The chart (charts/taskherd) is installed in a fresh namespace under the `restricted` Pod Security
Standard with one worker pool of bench/cluster_app.py (configure(app), concurrency 2), operator and
exporter off: the benchmark itself makes the scale call, through the Deployment's scale subresource
as the operator does (`kubectl scale`). The broker is the host's loopback Redis (a leased
database), which pods reach through a forwarder on the pod bridge. A backlog of short tasks waits
in the queue, so a new pod takes a task as soon as it consumes.

Each round scales 1 -> N (6) and times, per new pod (host clock; the local cluster shares it):

  schedule         scale call -> the pod is bound to a node (ReplicaSet controller + scheduler)
  container start  bound -> the worker process starts (sandbox, volumes, runc)
  imports          process start -> Celery's worker_init (interpreter, Celery, the app, taskherd)
  broker connect   worker_init -> consumer connected (pool forked, broker connection)
  first task       connected -> the pod's first task starts
  Ready            scale call -> the pod's Ready condition (the probes' periods decide the lag)

Pod events come from a `kubectl get pods --watch`, the worker's own timestamps from
bench/cluster_app.py. Variants (the pool's values): the chart's former defaults as the baseline
(exec probes, startup every 5 s, readiness every 10 s; Celery's mingle and gossip on), HTTP probes
with mingle and gossip, the chart's defaults (HTTP probes every second, `taskherd worker
--without-mingle --without-gossip`), and those through Celery's command line (`celery worker`, the
chart's command before `taskherd worker`). Medians over rounds; "all N" is the last of the new pods.

By default the pods run THIS checkout's worker package: its modules are compiled here and mounted
over the image's (a ConfigMap of sourceless .pyc files first on PYTHONPATH), so a change to the
worker's boot is measured without rebuilding the shared image. `--image-code` runs the image's.

The per-pod start times (scale call -> first task) of the chart-default variant are written to
$TASKHERD_HOME/bench/scaleup.json, which bench/autoscaling.py replays.

    source scripts/services.sh env && .venv/bin/python bench/scaleup.py [--rounds 3] [--to 6]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import time

import redis

import repo_paths  # noqa: F401 - first: the shared helpers below live in the repository

from e2e.lib.services import leased_redis_db
from e2e.lib.waiting import wait_for

from autoscaling import measured_starts_path
from cluster_bench import Release

QUEUE = "scaleup"
#: the worker's options as the chart renders them for this pool (for the variant that replaces the command)
WORKER_OPTIONS = [f"--queues={QUEUE}", "--concurrency=2", "--loglevel=INFO", "--soft-time-limit=20",
                  "--time-limit=30", "--max-tasks-per-child=1000", "--without-mingle", "--without-gossip"]
#: pool values of each variant (merged over the chart's defaults)
VARIANTS = {
    "exec probes 5 s / 10 s with mingle and gossip (before)": {
        "mingle": True, "gossip": True,
        "probes": {"type": "exec", "startup": {"periodSeconds": 5, "failureThreshold": 60},
                   "readiness": {"periodSeconds": 10}}},
    "HTTP probes with mingle and gossip": {"mingle": True, "gossip": True},
    "chart defaults": {},  # HTTP probes every second, `taskherd worker` without mingle and gossip
    "celery command line": {"command": ["celery", "--app=cluster_app", "worker", *WORKER_OPTIONS]},
}
PHASES = (("schedule", "scale_call", "bound"), ("container start", "bound", "process_started"),
          ("imports", "process_started", "worker_init"), ("broker connect", "worker_init", "connected"),
          ("first task", "connected", "first_task"))


def scale_round(release: Release, to: int, backlog: int) -> list[dict[str, float]]:
    """1 -> `to` with `backlog` one-second tasks waiting; per new pod, its timestamps (module doc)."""
    ledger = redis.Redis.from_url(release.host_ledger_url)
    before = set(release.settle(1))
    ledger.delete(QUEUE)
    release.publish("cluster.work", (1.0,), count=backlog)
    scale_call = time.time()
    release.scale(to)

    def new_pods_working() -> list[str]:
        new = [p for p in release.watch.live() if p not in before]
        return [p for p in new if "ready" in release.watch.times(p) and ledger.hexists(f"boot:{p}", "first_task")]

    new = wait_for(f"the {to - 1} new pods Ready and working", new_pods_working, 300, 0.25,
                   until=lambda working: len(working) == to - 1, explain=release.diagnostics)
    boots = {p: ledger.hgetall(f"boot:{p}") for p in new}
    pods = []
    for name in new:
        record = {k.decode(): float(v) for k, v in boots[name].items()}
        record.update(release.watch.times(name))
        record["scale_call"] = scale_call
        pods.append(record)
    ledger.delete(QUEUE)
    release.scale(1)
    release.settle(1)
    return pods


def ago(pods: list[dict], start: str, end: str) -> list[float]:
    return [p[end] - p[start] for p in pods if start in p and end in p]


def report(name: str, rounds: list[list[dict]]) -> dict:
    pods = [p for r in rounds for p in r]
    print(f"\n{name}: {len(rounds)} rounds, {len(pods)} new pods; median (max) seconds")
    row = {}
    for label, start, end in PHASES:
        values = ago(pods, start, end)
        row[label] = statistics.median(values)
        print(f"  {label:<34} {statistics.median(values):6.2f} ({max(values):6.2f})")
    for label, end in (("scale call -> taking tasks", "first_task"), ("scale call -> Ready", "ready")):
        per_pod = ago(pods, "scale_call", end)
        last = [max(ago(r, "scale_call", end)) for r in rounds]
        row[label] = statistics.median(per_pod)
        row[label + ", all"] = statistics.median(last)
        print(f"  {label:<34} {statistics.median(per_pod):6.2f} ({max(per_pod):6.2f}); all new pods: "
              f"{statistics.median(last):6.2f} (rounds: {', '.join(f'{v:.1f}' for v in last)})")
    ready_lag = ago(pods, "worker_ready", "ready")
    row["worker ready -> pod Ready"] = statistics.median(ready_lag)
    print(f"  {'worker ready -> pod Ready':<34} {statistics.median(ready_lag):6.2f} ({max(ready_lag):6.2f})")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--to", type=int, default=6, help="replicas to scale to from 1 (default 6)")
    parser.add_argument("--backlog", type=int, default=300, help="one-second tasks waiting at the scale call")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--image-code", action="store_true", help="run the image's taskherd, not this checkout's")
    args = parser.parse_args(argv)
    results, samples = {}, {}
    with leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as host_url, \
            Release(host_broker_url=host_url, host_ledger_url=host_url, queue=QUEUE, label="scaleup",
                    image_code=args.image_code) as release:
        for variant in args.variants.split(","):
            release.install(VARIANTS[variant])
            rounds = []
            for index in range(args.rounds):
                pods = scale_round(release, args.to, args.backlog)
                rounds.append(pods)
                last = max(p["ready"] - p["scale_call"] for p in pods)
                print(f"  {variant}, round {index + 1}: 1 -> {args.to}, all Ready after {last:.1f} s", flush=True)
            results[variant] = report(variant, rounds)
            samples[variant] = [p["first_task"] - p["scale_call"] for r in rounds for p in r]
    default = "chart defaults" if "chart defaults" in samples else next(iter(samples))
    out = measured_starts_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "what": f"seconds from the scale call (1 -> {args.to}) to each new pod's first task, variant {default!r}",
        "start_seconds": samples[default], "variants": results}, indent=1))
    print(f"\nper-pod start times written to {out} (bench/autoscaling.py replays them)")
    if len(results) > 1:
        base = results[next(iter(results))]
        print(f"\n{'scale call -> all new pods Ready':<40}" + "".join(f"{v:>26}" for v in results))
        print(f"{'':<40}" + "".join(f"{r['scale call -> Ready, all']:>25.1f}s" for r in results.values()))
        print(f"target: 1 -> {args.to} all Ready <= 10 s; baseline (first variant) "
              f"{base['scale call -> Ready, all']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
