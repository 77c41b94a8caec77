"""Redelivery latency after SIGKILL of a whole worker mid-task: Redis vanilla, Redis with taskherd
fast recovery, RabbitMQ — side by side, median of N runs each.

One run: two idle workers (prefork, concurrency 1, acks_late, reject_on_worker_lost, prefetch 1)
consume one queue; one task is published; the worker that starts it is SIGKILLed together with its
pool child (its whole session); we measure from the kill to the moment the task STARTS again on the
other worker (the task writes its start time to Redis). A fresh worker replaces the victim.
Before each publish we wait a random time, uniform over the period of the timer that decides each
mode (kombu's 100 s sweep, taskherd's 1 s lease refresh, 1 s for RabbitMQ; fixed seed): otherwise
every run would deliver and kill at the same phase of that timer and the figures would be one point
of its range. The kill comes 0.5 s after the task started (for vanilla Redis it must come before
visibility_timeout, or kombu redelivers the task while the victim still runs it).

Redis vanilla cannot be measured with the default ``visibility_timeout`` (3600 s): it runs with
``--vanilla-visibility`` (10 s) and the default sweep settings, and the default-configuration
expectation is printed beside it. Needs the services: ``source scripts/services.sh env``.

    .venv/bin/python bench/redelivery.py [--runs 5] [--modes redis-vanilla,redis-taskherd,rabbitmq]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

import repo_paths  # noqa: F401 - first: the shared helpers below live in the repository
from e2e.lib.services import fresh_vhost, leased_redis_db
from e2e.lib.waiting import wait_for
from support.worker_process import WorkerProcess

#: kombu 5.6–5.7: restore_visible scans every unacked_restore_interval (10 s) x throttle (10).
KOMBU_SWEEP_SECONDS = 100
DEFAULT_VISIBILITY = 3600
KILL_AFTER_START = 0.5


def one_run(*, broker_url: str, ledger: redis.Redis, ledger_url: str, queue: str, env: dict, workers: list,
            log_dir: Path, wait_limit: float, phase_delay: float) -> float:
    """Kills the worker running a fresh task; returns seconds until the task starts elsewhere."""
    from celery import Celery

    token = uuid.uuid4().hex
    time.sleep(phase_delay)
    producer = Celery(broker=broker_url)
    producer.send_task("recovery.hold", args=(token, 600), kwargs={"redelivered_seconds": 0.2}, queue=queue)
    producer.close()
    starts = wait_for("the task to start", lambda: _starts(ledger, token), 60, 0.05)
    victim = next(w for w in workers if starts[0]["host"].startswith(w.hostname.split("@")[0]))
    time.sleep(KILL_AFTER_START)
    killed_at = time.time()
    victim.kill()
    restarted = wait_for("the task to start again", lambda: _starts(ledger, token)[1:], wait_limit, 0.05)[0]
    workers.remove(victim)
    replacement = WorkerProcess("apps.recovery_app", log_dir=log_dir, queues=[queue], env=env, concurrency=1)
    workers.append(replacement.start())
    wait_for("the restarted task to finish", lambda: _ends(ledger, token), 60, 0.05)
    return restarted["at"] - killed_at


def _starts(ledger, token):
    return [r for r in map(json.loads, ledger.lrange(f"runs:{token}", 0, -1)) if r["event"] == "start"]


def _ends(ledger, token):
    return [r for r in map(json.loads, ledger.lrange(f"runs:{token}", 0, -1)) if r["event"] == "end"]


#: The period of the timer that decides each mode's latency (see the module docstring).
PHASE_PERIOD = {"redis-vanilla": KOMBU_SWEEP_SECONDS, "redis-taskherd": 1.0, "rabbitmq": 1.0}


def measure(mode: str, *, runs: int, vanilla_visibility: float, rng: random.Random) -> list[float]:
    redis_base = os.environ["TASKHERD_REDIS_URL"]
    with contextlib.ExitStack() as stack:
        ledger_url = stack.enter_context(leased_redis_db(redis_base))
        ledger = redis.Redis.from_url(ledger_url)
        queue = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
        env = {"TEST_QUEUE": queue, "TEST_LEDGER_URL": ledger_url}
        if mode == "rabbitmq":
            broker_url = stack.enter_context(fresh_vhost(os.environ["TASKHERD_AMQP_URL"],
                                                         os.environ["TASKHERD_RABBITMQ_API_URL"]))
            wait_limit = 120
        else:
            broker_url = ledger_url
            recovery = mode == "redis-taskherd"
            env |= {"TEST_RECOVERY": "1" if recovery else "0",
                    "TEST_VISIBILITY_TIMEOUT": str(DEFAULT_VISIBILITY if recovery else vanilla_visibility)}
            wait_limit = 120 if recovery else vanilla_visibility + KOMBU_SWEEP_SECONDS + 60
        env["TEST_BROKER_URL"] = broker_url
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-redelivery-")))
        workers = [WorkerProcess("apps.recovery_app", log_dir=log_dir, queues=[queue], env=env,
                                 concurrency=1).start() for _ in range(2)]
        stack.callback(lambda: [w.kill() for w in workers])
        latencies = []
        for i in range(runs):
            delay = rng.uniform(0, PHASE_PERIOD[mode])
            latency = one_run(broker_url=broker_url, ledger=ledger, ledger_url=ledger_url, queue=queue, env=env,
                              workers=workers, log_dir=log_dir, wait_limit=wait_limit, phase_delay=delay)
            latencies.append(latency)
            print(f"  {mode:<15} run {i + 1}/{runs}: {latency:7.2f} s (published after {delay:5.1f} s idle)",
                  flush=True)
        return latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--vanilla-visibility", type=float, default=10.0,
                        help="visibility_timeout for the vanilla Redis runs (default %(default)s s)")
    parser.add_argument("--modes", default="redis-taskherd,rabbitmq,redis-vanilla")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwind: kill the workers, release the leases
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results = {}
    for mode in modes:
        print(f"measuring {mode} ({args.runs} runs)…", flush=True)
        results[mode] = measure(mode, runs=args.runs, vanilla_visibility=args.vanilla_visibility, rng=rng)

    describe = {
        "redis-vanilla": f"Redis, kombu only, visibility_timeout={args.vanilla_visibility:g} s",
        "redis-taskherd": "Redis + taskherd recovery (heartbeat 1 s, timeout 4 s), visibility_timeout=3600 s",
        "rabbitmq": "RabbitMQ classic queue (connection close requeues)",
    }
    print()
    print(f"Redelivery latency after SIGKILL of the whole worker mid-task (start to start, {args.runs} runs each)")
    print(f"{'configuration':<88} {'median':>8} {'min':>8} {'max':>8}")
    for mode, latencies in results.items():
        print(f"{describe[mode]:<88} {statistics.median(latencies):>7.2f}s {min(latencies):>7.2f}s "
              f"{max(latencies):>7.2f}s")
    expected_low, expected_high = DEFAULT_VISIBILITY, DEFAULT_VISIBILITY + KOMBU_SWEEP_SECONDS
    print(f"{'Redis, kombu only, DEFAULT visibility_timeout=3600 s (expected, not measured)':<88} "
          f"{'~' + str(expected_low) + '-' + str(expected_high) + 's':>26}")
    if "redis-taskherd" in results:
        taskherd = statistics.median(results["redis-taskherd"])
        print(f"\nRedis + taskherd vs vanilla default: ~{expected_low / taskherd:.0f}x faster "
              f"({taskherd:.1f} s vs >= {expected_low} s)")
        if "redis-vanilla" in results:
            print(f"Redis + taskherd vs vanilla at visibility_timeout={args.vanilla_visibility:g} s: "
                  f"{statistics.median(results['redis-vanilla']) / taskherd:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
