"""Throughput cost of taskherd's delivery tracking on Redis: no-op tasks per second, with and without.

The queue is filled with N no-op tasks first; a prefork worker (concurrency 2, acks_late,
reject_on_worker_lost, prefetch 1 — the reliability profile's settings) is started and timed from
"ready" until every task has run (each increments a Redis counter). Median of R runs per mode.
Tracking adds, per delivery, two HSETs inside kombu's existing MULTI and turns the ack's pipeline
into one EVALSHA; the lease thread costs one round trip per 5 s.

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
