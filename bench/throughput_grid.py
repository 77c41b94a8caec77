"""Cost as the work grows: tasks/s and worker CPU per task against concurrency 1-8 and worker pods 1-6.

Same harness as bench/throughput.py (a queue filled first, the clock from the first message taken to
the last, CPU from /proc), with vanilla Celery (the same ack settings) beside the taskherd profile
plus the Redis idempotency guard in every cell:

- **concurrency**: one worker, prefork `--concurrency` 1..8;
- **pods**: 1..6 worker processes (prefork, concurrency 2 each) on the same queue, what 1..6 pods
  of a pool are, all on this machine's 2 cores.

Tasks sleep `--task-ms` (10 ms by default: with no-op tasks every cell is CPU-bound and only the
first two cores count). Figures: median over `--rounds`; tasks/s, worker CPU per task (all worker
processes), and taskherd's overhead beside vanilla in the same cell.

    source scripts/services.sh env && .venv/bin/python bench/throughput_grid.py [--tasks 2000] [--rounds 1]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from repo_paths import ROOT  # first: the shared helpers below live in the repository

from e2e.lib import services
from e2e.lib.waiting import wait_for

from throughput import cpu_seconds, filled_queue

VARIANTS = ("vanilla", "taskherd")


def grid_run(variant: str, broker_url: str, redis_url: str, *, tasks: int, workers: int, concurrency: int,
             task_ms: float, log_dir: Path) -> tuple[float, float]:
    """(tasks/s, worker CPU µs per task) of `workers` workers draining `tasks` tasks."""
    queue, app, depth = filled_queue(variant, broker_url, tasks, prefix="grid")
    env = {**os.environ, "BENCH_VARIANT": variant, "BENCH_QUEUE": queue, "BENCH_BROKER_URL": broker_url,
           "BENCH_REDIS_URL": redis_url, "BENCH_TASK_MS": str(task_ms),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"), os.environ.get("PYTHONPATH")]))}
    processes = []
    try:
        for index in range(workers):
            log = open(log_dir / f"{queue}-{index}.log", "wb")
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "throughput_app", "worker", "--pool", "prefork",
                 "--concurrency", str(concurrency), "--hostname", f"w{index}-{queue}@%h", "--loglevel", "WARNING",
                 "--without-mingle", "--without-gossip", "--without-heartbeat", "--queues", queue],
                env=env, cwd=ROOT / "bench", stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()

        def depth_while_alive() -> int:
            dead = [p.pid for p in processes if p.poll() is not None]
            assert not dead, f"worker(s) {dead} exited: see {log_dir}"
            return depth()

        at_start = wait_for("the workers to take their first message (messages left)", depth_while_alive, 180,
                            0.005, until=lambda left: left < tasks)
        started = time.monotonic()
        cpu_at_start = sum(cpu_seconds(p.pid) for p in processes)
        wait_for("the queue drained (messages left)", depth_while_alive, 900, 0.005, equals=0)
        elapsed = time.monotonic() - started
        cpu = sum(cpu_seconds(p.pid) for p in processes) - cpu_at_start
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(60)
        app.close()
    return at_start / elapsed, cpu * 1e6 / at_start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--task-ms", type=float, default=10.0)
    parser.add_argument("--brokers", default="redis")
    parser.add_argument("--concurrency", default="1,2,3,4,6,8", help="cells of the concurrency row")
    parser.add_argument("--pods", default="1,2,3,4,5,6", help="cells of the pods row (concurrency 2 each)")
    args = parser.parse_args(argv)
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"taskherd-grid-{uuid.uuid4().hex[:6]}"
    log_dir.mkdir()
    cells = [("concurrency", 1, int(c)) for c in args.concurrency.split(",")] + \
            [("pods", int(p), 2) for p in args.pods.split(",")]
    figures: dict[tuple, list[tuple[float, float]]] = {}
    with services.leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as redis_url:
        for broker in args.brokers.split(","):
            with contextlib.ExitStack() as stack:
                broker_url = redis_url if broker == "redis" else stack.enter_context(services.fresh_vhost(
                    os.environ["TASKHERD_AMQP_URL"], os.environ["TASKHERD_RABBITMQ_API_URL"]))
                for round_ in range(args.rounds):
                    for row, workers, concurrency in cells:
                        for variant in (VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]):
                            rate, cpu = grid_run(variant, broker_url, redis_url, tasks=args.tasks, workers=workers,
                                                 concurrency=concurrency, task_ms=args.task_ms, log_dir=log_dir)
                            figures.setdefault((broker, row, workers, concurrency, variant), []).append((rate, cpu))
                            print(f"  {broker:<8} {workers} x c={concurrency} {variant:<9} round {round_ + 1}: "
                                  f"{rate:7.1f} tasks/s {cpu:6.0f} us CPU/task", flush=True)
    print(f"\n{args.task_ms:g} ms tasks, {args.tasks} per cell, median of {args.rounds} round(s), 2 cores")
    print(f"{'broker':<9}{'cell':<16}{'vanilla /s':>12}{'taskherd /s':>13}{'overhead':>10}"
          f"{'vanilla us/task':>17}{'taskherd us/task':>18}{'CPU +':>8}")
    for broker in args.brokers.split(","):
        for row, workers, concurrency in cells:
            medians = {v: (statistics.median(r for r, _ in figures[(broker, row, workers, concurrency, v)]),
                           statistics.median(c for _, c in figures[(broker, row, workers, concurrency, v)]))
                       for v in VARIANTS}
            (vr, vc), (tr, tc) = medians["vanilla"], medians["taskherd"]
            cell = f"c={concurrency}" if row == "concurrency" else f"{workers} pods x c=2"
            print(f"{broker:<9}{cell:<16}{vr:>12.1f}{tr:>13.1f}{(1 - tr / vr) * 100:>9.1f}%"
                  f"{vc:>17.0f}{tc:>18.0f}{(tc / vc - 1) * 100:>7.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
