"""What taskherd's fast recovery costs on Redis: throughput with and without delivery tracking, and
the lease traffic of idle workers (CPU and Redis commands per worker per second).

1. The queue is filled with N no-op tasks first; a prefork worker (concurrency 2, acks_late,
   reject_on_worker_lost, prefetch 1 — the reliability profile's settings) is started and timed
   from "ready" until every task has run (each increments a Redis counter). Median of R runs per
   mode. Tracking adds, per delivery, two HSETs inside kombu's existing MULTI and turns the ack's
   pipeline into one EVALSHA.
2. `--idle-workers` idle workers on a private redis-server (nothing else talks to it), with and
   without recovery, for `--idle-seconds`: the CPU of their main processes and the commands Redis
   processed, per worker and second. The difference is the lease traffic (a refresh and a restorer
   pass every second by default). Target: <= 1 % of a core per worker.

    source scripts/services.sh env && .venv/bin/python bench/recovery_overhead.py [--tasks 2000] [--runs 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

import repo_paths  # noqa: F401 - first: the shared helpers below live in the repository
from e2e.lib.services import leased_redis_db
from e2e.lib.waiting import wait_for
from support.worker_process import WorkerProcess

from taskherd.worker.components.recovery import DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_TIMEOUT


def one_run(*, tracking: bool, tasks: int) -> float:
    from celery import Celery

    with leased_redis_db(os.environ["TASKHERD_REDIS_URL"]) as url, tempfile.TemporaryDirectory() as log_dir:
        client = redis.Redis.from_url(url)
        queue, token = f"bench-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
        producer = Celery(broker=url)
        with producer.producer_or_acquire() as publisher:
            for _ in range(tasks):
                producer.send_task("recovery.count", args=(token,), queue=queue, producer=publisher)
        producer.close()
        env = {"TEST_BROKER_URL": url, "TEST_QUEUE": queue, "TEST_LEDGER_URL": url,
               "TEST_RECOVERY": "1" if tracking else "0"}
        worker = WorkerProcess("apps.recovery_app", log_dir=Path(log_dir), queues=[queue], env=env, concurrency=2)
        try:
            worker.start()
            started = time.monotonic()
            wait_for("tasks run", lambda: int(client.get(f"count:{token}") or 0), 600, 0.02, equals=tasks)
            return tasks / (time.monotonic() - started)
        finally:
            worker.kill()


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_traffic(*, recovery: bool, workers: int, seconds: float) -> tuple[float, float]:
    """(CPU seconds per second, Redis commands per second) per idle worker, on a private Redis."""
    from support.private_redis import PrivateRedis

    with tempfile.TemporaryDirectory() as scratch:
        server = PrivateRedis(Path(scratch))
        server.start()
        started = []
        try:
            env = {"TEST_BROKER_URL": f"{server.url}/0", "TEST_QUEUE": "idle", "TEST_LEDGER_URL": f"{server.url}/1",
                   "TEST_RECOVERY": "1" if recovery else "0"}
            for _ in range(workers):
                started.append(WorkerProcess("apps.recovery_app", log_dir=Path(scratch), queues=["idle"], env=env,
                                             concurrency=1).start())
            time.sleep(max(5.0, 2 * DEFAULT_TIMEOUT))  # past start-up, and a lease period: restorer passes run
            client = redis.Redis(port=server.port)
            commands, cpu, wall = (int(client.info("stats")["total_commands_processed"]),
                                   sum(process_cpu(w.pid) for w in started), time.monotonic())
            time.sleep(seconds)
            elapsed = time.monotonic() - wall
            commands = int(client.info("stats")["total_commands_processed"]) - commands - 1  # minus our INFO
            cpu = sum(process_cpu(w.pid) for w in started) - cpu
        finally:
            for worker in started:
                worker.kill()
            server.stop()
    return cpu / elapsed / workers, commands / elapsed / workers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle-workers", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for i in range(args.runs):
        for tracking in (False, True):  # interleaved, so that machine load hits both alike
            rate = one_run(tracking=tracking, tasks=args.tasks)
            rates[tracking].append(rate)
            print(f"  run {i + 1}/{args.runs} {'tracking' if tracking else 'vanilla ':>8}: {rate:6.0f} tasks/s",
                  flush=True)
    vanilla, tracked = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"\nNo-op tasks/s, prefork c=2, acks_late + prefetch 1, {args.tasks} tasks, median of {args.runs}")
    print(f"{'Redis, kombu only':<40} {vanilla:8.0f}")
    print(f"{'Redis + taskherd delivery tracking':<40} {tracked:8.0f}   ({(tracked / vanilla - 1) * 100:+.1f}%)")

    without = idle_traffic(recovery=False, workers=args.idle_workers, seconds=args.idle_seconds)
    with_recovery = idle_traffic(recovery=True, workers=args.idle_workers, seconds=args.idle_seconds)
    lease_cpu = with_recovery[0] - without[0]
    print(f"\nIdle worker, per worker and second, {args.idle_workers} workers for {args.idle_seconds:g} s "
          f"(lease {DEFAULT_TIMEOUT:g} s refreshed every {DEFAULT_HEARTBEAT_INTERVAL:g} s)")
    print(f"{'':<40}{'main-process CPU':>18}{'Redis commands':>16}")
    print(f"{'Redis, kombu only':<40}{without[0] * 1000:>15.2f} ms{without[1]:>16.1f}")
    print(f"{'Redis + taskherd fast recovery':<40}{with_recovery[0] * 1000:>15.2f} ms{with_recovery[1]:>16.1f}")
    print(f"lease traffic: {lease_cpu * 100:.3f} % of a core and {with_recovery[1] - without[1]:.1f} commands per "
          f"worker per second; target <= 1 % of a core: {'MET' if lease_cpu <= 0.01 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
